"""Non-colocated refit: broadcast the policy's weights to a generator in another process.

The policy exports HF-named tensors one fused group at a time; groups are packed into buckets of at most
``bucket_bytes`` without splitting one (vLLM loads q/k/v and gate/up into fused parameters). For each
bucket the generator's actor is told the names, shapes and dtypes (a Ray call), receives the bytes by
``torch.distributed`` broadcasts (one per tensor, from the exported tensor itself, into the actor's flat
receive buffer) over a dedicated two-rank group (this process rank 0, the actor rank 1;
gloo on CPU, NCCL when the weights are on a GPU), and reloads them; one bucket is in flight at a time, so
the extra memory on either side is one bucket. After the last bucket the prefix cache is reset, or later
samples reuse attention state computed with the old weights.

The group is opened on the first sync and kept for later ones; it never touches the default process group
(Megatron's and vLLM's own). If the actor fails mid-bucket the group is dropped and reopened next time.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from rlkit.generation.base import bucket_groups
from rlkit.policy.base import Policy
from rlkit.weight_sync.colocated import RefitReport


class BroadcastWeightSync:
    """``sync(policy, generator) -> RefitReport`` for a :class:`rlkit.generation.remote.RemoteGenerator`."""

    def __init__(self, bucket_bytes: float = 256e6):
        self.bucket_bytes = bucket_bytes
        self._peer: Optional[Any] = None  # the generator the open group leads to
        self._store = self._group = None
        self.backend: Optional[str] = None
        self.last_actor_seconds: dict[str, float] = {}

    def sync(self, policy: Policy, generator: Any) -> RefitReport:
        from rlkit.distributed import start_broadcast
        from rlkit.generation.remote import as_bytes, bucket_layout

        if not hasattr(generator, "receive_bucket"):
            raise TypeError(f"BroadcastWeightSync needs a generator in another process (RemoteGenerator), got "
                            f"{type(generator).__name__}; use ColocatedWeightSync for an in-process engine")
        t0 = time.perf_counter()
        moved = tensors = buckets = 0
        receive_s = load_s = 0.0
        for bucket in bucket_groups(policy.export_hf_groups(), self.bucket_bytes):
            specs, nbytes = bucket_layout(bucket)
            group = self._group_to(generator, "nccl" if bucket[0][1].is_cuda else "gloo")
            receiving = generator.receive_bucket(specs, nbytes)
            try:
                # One broadcast per tensor, straight from the exported tensor (no packing copy). All are
                # started before waiting on the actor, so an actor that fails before receiving raises from
                # wait() instead of leaving this process blocked in a broadcast.
                payload = [as_bytes(t) for _, t in bucket]  # held until every broadcast has finished
                sending = [start_broadcast(group, b) for b in payload]
                seconds = generator.wait(receiving)  # once the actor has received and loaded the bucket
                receive_s, load_s = receive_s + seconds[0], load_s + seconds[1]
                for work in sending:
                    work.wait()
            except BaseException:
                self.close()  # the two ranks may be out of step: open a fresh group next time
                raise
            moved += sum(s.nbytes for s in specs)
            tensors += len(specs)
            buckets += 1
        generator.reset_prefix_cache()
        self.last_actor_seconds = {"receive": receive_s, "load": load_s}  # the actor's side of the last sync
        return RefitReport(time.perf_counter() - t0, moved, tensors, buckets, policy.version)

    def _group_to(self, generator: Any, backend: str) -> Any:
        if self._group is None or self._peer is not generator or self.backend != backend:
            self.close()
            self._store, self._group = generator.open_weight_group(backend)
            self._peer, self.backend = generator, backend
        return self._group

    def close(self) -> None:
        """Forget the group (the actor's end goes away with the actor)."""
        self._store = self._group = self._peer = None
        self.backend = None

    def __repr__(self) -> str:
        state = f"open ({self.backend})" if self._group is not None else "not connected"
        return f"BroadcastWeightSync(bucket={self.bucket_bytes / 1e6:.0f} MB, group {state})"

    def _repr_html_(self) -> str:
        import html

        return f"<code>{html.escape(repr(self))}</code>"

