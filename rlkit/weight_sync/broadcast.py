"""Non-colocated refit: broadcast the policy's weights to a vLLM engine in a Ray actor.

The buckets of whole fused groups and the final prefix-cache reset are the colocated refit's
(:func:`rlkit.weight_sync.colocated.refit_in_buckets`); what differs is how a bucket travels. The actor is
told its names, shapes and dtypes (a Ray call), receives the bytes by ``torch.distributed`` broadcasts
(one per tensor, from the exported tensor itself, into the actor's flat receive buffer) over a dedicated
two-rank group (this process rank 0, the actor rank 1; gloo on CPU, NCCL when the weights are on a GPU),
and reloads them; one bucket is in flight at a time, so the extra memory on either side is one bucket.

Both ends live here: :class:`BroadcastReceiver` is mixed into the engine's actor
(``RemoteGenerator(..., actor_extension=BroadcastReceiver)``), and :class:`BroadcastWeightSync` is built
with that generator and refits only it (:func:`rlkit.builders.build_generation` makes the pair).

The group is opened on the first sync and kept for later ones; it never touches the default process group
(Megatron's and vLLM's own). If the actor fails mid-bucket the group is dropped and reopened next time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterable, Optional

import torch

from rlkit.weight_sync.colocated import RefitReport, refit_in_buckets
from rlkit.weights import HFGroup, WeightSource

ALIGN_BYTES = 64  # tensors start at multiples of this in a receive buffer, so dtype views are legal


@dataclass(frozen=True)
class TensorSpec:
    """Where one HF-named tensor sits in a bucket's receive buffer (a flat uint8 tensor)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int  # bytes
    nbytes: int


def bucket_layout(bucket: Iterable[tuple[str, torch.Tensor]]) -> tuple[list[TensorSpec], int]:
    """Where each tensor of ``bucket`` goes in one flat uint8 receive buffer, and the buffer's size."""
    specs, offset = [], 0
    for name, t in bucket:
        n = t.numel() * t.element_size()
        specs.append(TensorSpec(name, tuple(t.shape), t.dtype, offset, n))
        offset += -(-n // ALIGN_BYTES) * ALIGN_BYTES
    return specs, offset


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a flat uint8 tensor: a view when ``t`` is contiguous (the usual case), else one copy."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def unpack_bucket(flat: torch.Tensor, specs: list[TensorSpec]) -> HFGroup:
    """Views into ``flat`` with the names, shapes and dtypes of ``specs`` (no copy)."""
    return [(s.name, flat[s.offset:s.offset + s.nbytes].view(s.dtype).view(s.shape)) for s in specs]


class BroadcastReceiver:
    """The actor's end (rank 1), mixed into the engine's actor class: ``self`` is the engine it loads."""

    weight_group: Any = None  # the open two-rank group; None until join_weight_group
    weight_device = "cpu"

    def join_weight_group(self, host: str, port: int, backend: str) -> None:
        from rlkit.distributed import pair_group

        self._weight_store, self.weight_group = pair_group(host, port, rank=1, backend=backend)
        self.weight_device = "cuda" if backend == "nccl" else "cpu"

    def receive_bucket(self, specs: list[TensorSpec], nbytes: int) -> tuple[float, float]:
        """Receive one bucket from rank 0, one broadcast per tensor straight into its place in a flat
        buffer (the sender needs no packing copy), and load it; returns (receive, load) seconds."""
        from rlkit.distributed import start_broadcast

        t0 = time.perf_counter()
        flat = torch.empty(nbytes, dtype=torch.uint8, device=self.weight_device)
        works = [start_broadcast(self.weight_group, flat[s.offset:s.offset + s.nbytes], root=0) for s in specs]
        for work in works:
            work.wait()
        t1 = time.perf_counter()
        self.update_weights(unpack_bucket(flat, specs))
        return t1 - t0, time.perf_counter() - t1


class BroadcastWeightSync:
    """``sync(policy, generator) -> RefitReport`` for the one :class:`rlkit.generation.remote.RemoteGenerator`
    it was built with, whose actor carries a :class:`BroadcastReceiver`."""

    def __init__(self, generator: Any, bucket_bytes: float = 256e6):
        self.generator = generator  # the RemoteGenerator this sync refits (its ``actor`` is the peer)
        self.bucket_bytes = bucket_bytes
        self.group: Optional[Any] = None  # this process's end (rank 0) of the open group
        self._store = None
        self.backend: Optional[str] = None
        self.last_actor_seconds: dict[str, float] = {}

    def sync(self, policy: WeightSource, generator: Any) -> RefitReport:
        if generator is not self.generator:
            raise ValueError(f"this BroadcastWeightSync refits {self.generator!r}, not {generator!r}: build a "
                             "generator and its sync together (rlkit.builders.build_generation)")
        self.last_actor_seconds = {"receive": 0.0, "load": 0.0}  # the actor's side of this sync
        return refit_in_buckets(policy, generator, self.bucket_bytes, self._send)

    def _send(self, bucket: HFGroup) -> None:
        import ray

        from rlkit.distributed import start_broadcast

        specs, nbytes = bucket_layout(bucket)
        group = self._open("nccl" if bucket[0][1].is_cuda else "gloo")
        receiving = self.generator.actor.receive_bucket.remote(specs, nbytes)
        try:
            # One broadcast per tensor, straight from the exported tensor (no packing copy). All are started
            # before waiting on the actor, so an actor that fails before receiving raises from ray.get
            # instead of leaving this process blocked in a broadcast.
            payload = [as_bytes(t) for _, t in bucket]  # held until every broadcast has finished
            sending = [start_broadcast(group, b) for b in payload]
            seconds = ray.get(receiving)  # once the actor has received and loaded the bucket
            for work in sending:
                work.wait()
        except BaseException:
            self.close()  # the two ranks may be out of step: open a fresh group next time
            raise
        self.last_actor_seconds["receive"] += seconds[0]
        self.last_actor_seconds["load"] += seconds[1]

    def _open(self, backend: str) -> Any:
        """This process's end of a two-rank group to the actor (rank 1), opened when none is open for ``backend``."""
        import ray

        from rlkit.distributed import free_address, pair_group

        if self.group is None or self.backend != backend:
            self.close()
            host, port = free_address()
            joined = self.generator.actor.join_weight_group.remote(host, port, backend)
            self._store, self.group = pair_group(host, port, rank=0, backend=backend)
            ray.get(joined)
            self.backend = backend
        return self.group

    def close(self) -> None:
        """Forget the group (the actor's end goes away with the actor)."""
        self._store = self.group = None
        self.backend = None

    def __repr__(self) -> str:
        state = f"open ({self.backend})" if self.group is not None else "not connected"
        return f"BroadcastWeightSync(bucket={self.bucket_bytes / 1e6:.0f} MB, group {state})"

    def _repr_html_(self) -> str:
        import html

        return f"<code>{html.escape(repr(self))}</code>"
