"""Non-colocated refit: broadcast the policy's weights to a vLLM engine in a Ray actor, pipelined.

One refit is one stream over a dedicated two-rank group (this process rank 0, the actor rank 1; gloo on CPU,
NCCL when the weights are on a GPU), and on the actor's side one ``reload_weights`` call that consumes it:

    rank 0 (the sender)                                  rank 1 (the actor, inside one reload call)
    receive_weights.remote() (a Ray call) ------------->  starts vLLM's reload over the incoming tensors
    for each bucket k (whole fused groups, <= bucket_bytes):
      header k: its length, then JSON TensorSpecs ---->  posts bucket k's receives into buffer k % 2
      one broadcast per tensor, from the exported ---->  (buffers pre-allocated, kept across refits)
      tensor itself (no packing copy)                     each tensor goes to vLLM as soon as it lands;
      (bucket k+1 is exported while k is on the wire)     bucket k+1's receives are posted once bucket k
                                                          has landed: reload k || transfer k+1
    end header (length 0) ---------------------------->  the stream ends, the reload finishes
    reset_prefix_cache (a Ray call)

So the export of bucket k+1 overlaps the broadcast of bucket k (gloo and NCCL run them in their own
threads), and vLLM's reload of bucket k overlaps the transfer of bucket k+1; vLLM's fixed cost per reload call
(a walk over all its modules) is paid once per refit. Each side holds at most two buckets: the sender waits
for bucket k's broadcasts before sending bucket k+2, and the receiver writes bucket k+2 into bucket k's
buffer only once vLLM asks for the tensor after bucket k's last (vLLM copies a layer into the engine as soon
as its last tensor is loaded, and buckets hold whole layers).

Both ends live here: :class:`BroadcastReceiver` is mixed into the engine's actor
(``RemoteGenerator(..., actor_extension=BroadcastReceiver)``), and :class:`BroadcastWeightSync` is built with
that generator and refits only it (:func:`rlkit.builders.build_generation` makes the pair). A policy whose
ranks live in Ray workers gets :class:`RanksBroadcastWeightSync`: its rank 0 runs a :class:`BroadcastWeightSync`.

The group is opened on the first sync and kept for later ones; it never touches the default process group
(Megatron's and vLLM's own). If the transfer fails, the actor ends its stream there, so vLLM's reload finishes
(keeping the old weights of the layers it did not get), and raises; the sender drops the group and opens a new one next
time, and the generator counts as stale until a refit succeeds.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Iterator, Optional

import torch

from rlkit.notebook.html import CodeRepr
from rlkit.weight_sync.colocated import RefitReport, stream_refit
from rlkit.weights import HFGroup, WeightSource, bucket_groups

ALIGN_BYTES = 64  # tensors start at multiples of this in a receive buffer, so dtype views are legal
BUCKETS_IN_FLIGHT = 2  # per side: the bucket being loaded (or sent) and the next one on the wire


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


def encode_header(specs: list[TensorSpec]) -> torch.Tensor:
    """``specs`` as JSON bytes in a uint8 tensor (what travels ahead of a bucket)."""
    rows = [dict(asdict(s), dtype=str(s.dtype).removeprefix("torch.")) for s in specs]
    return torch.frombuffer(bytearray(json.dumps(rows).encode()), dtype=torch.uint8)


def decode_header(raw: torch.Tensor) -> list[TensorSpec]:
    rows = json.loads(raw.numpy().tobytes())
    return [TensorSpec(r["name"], tuple(r["shape"]), getattr(torch, r["dtype"]), r["offset"], r["nbytes"]) for r in rows]


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a flat uint8 tensor: a view when ``t`` is contiguous (the usual case), else one copy."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def unpack_bucket(flat: torch.Tensor, specs: list[TensorSpec]) -> HFGroup:
    """Views into ``flat`` with the names, shapes and dtypes of ``specs`` (no copy)."""
    return [(s.name, flat[s.offset:s.offset + s.nbytes].view(s.dtype).view(s.shape)) for s in specs]


def send_buckets(group: Any, buckets: Iterable[HFGroup], wait: Callable[[list], None]) -> int:
    """Rank 0's side of one refit's stream (see the module docstring): each bucket's header and tensors, then
    the end header. ``wait(works)`` waits for a bucket's broadcasts (the caller can watch its peer meanwhile);
    at most :data:`BUCKETS_IN_FLIGHT` buckets are held. Returns the number of buckets sent."""
    from rlkit.distributed import start_broadcast

    in_flight: deque[tuple[list, list]] = deque()  # (works, the tensors they read) per bucket on the wire
    sent, device = 0, torch.device("cpu")
    for bucket in buckets:
        while len(in_flight) >= BUCKETS_IN_FLIGHT:
            wait(in_flight.popleft()[0])
        device = bucket[0][1].device  # headers travel where the weights do (NCCL sends device tensors only)
        header = encode_header(bucket_layout(bucket)[0]).to(device)
        length = torch.tensor([header.numel()], dtype=torch.int64, device=device)
        payload = [length, header] + [as_bytes(t) for _, t in bucket]
        in_flight.append(([start_broadcast(group, b) for b in payload], payload))
        sent += 1
    end = torch.zeros(1, dtype=torch.int64, device=device)
    in_flight.append(([start_broadcast(group, end)], [end]))
    while in_flight:
        wait(in_flight.popleft()[0])
    return sent


class BroadcastReceiver:
    """The actor's end (rank 1), mixed into the engine's actor class: ``self`` is the engine it loads."""

    weight_group: Any = None  # the open two-rank group; None until join_weight_group
    weight_device = "cpu"
    receive_buffers: Optional[list[torch.Tensor]] = None  # two flat uint8 buffers, grown on demand and kept

    def join_weight_group(self, host: str, port: int, backend: str) -> None:
        from rlkit.distributed import pair_group

        self._weight_store, self.weight_group = pair_group(host, port, rank=1, backend=backend)
        self.weight_device = "cuda" if backend == "nccl" else "cpu"

    def receive_weights(self) -> dict[str, float]:
        """Receive one refit's stream from rank 0 and load it in one ``update_weights`` call; returns the
        seconds spent waiting for bytes (``receive``) and the rest of the reload (``load``). A failed
        transfer ends the stream early (so vLLM's reload finishes cleanly) and is raised after."""
        clock = {"receive": 0.0, "load": 0.0}
        failures: list[BaseException] = []
        t0 = time.perf_counter()
        self.update_weights(self._incoming(clock, failures))
        clock["load"] = time.perf_counter() - t0 - clock["receive"]
        if failures:
            raise failures[0]
        return clock

    def _incoming(self, clock: dict[str, float], failures: list[BaseException]) -> Iterator[tuple[str, torch.Tensor]]:
        """The received tensors, each handed on as soon as its own broadcast has landed (vLLM reloads a layer
        while the next ones are on the wire, within a bucket too). Bucket k+1's receives are posted once bucket
        k's last broadcast has landed (its header follows it on the wire), into the other buffer; bucket k+2's
        only once bucket k has been consumed (they reuse its buffer)."""
        try:
            slot, current = 0, self._post(0, clock)
            while current is not None:
                specs, works, flat = current
                posted, upcoming = False, None
                for work, pair in zip(works, unpack_bucket(flat, specs)):
                    t0 = time.perf_counter()
                    work.wait()
                    clock["receive"] += time.perf_counter() - t0
                    if not posted and works[-1].is_completed():
                        posted, upcoming = True, self._post(1 - slot, clock)
                    yield pair
                if not posted:
                    upcoming = self._post(1 - slot, clock)
                slot, current = 1 - slot, upcoming
        except Exception as e:  # noqa: BLE001 - raised by receive_weights once vLLM's reload has finished
            failures.append(e)

    def _post(self, slot: int, clock: dict[str, float]) -> Optional[tuple[list[TensorSpec], list, torch.Tensor]]:
        """Read the next bucket's header and post its receives into buffer ``slot``; None at the end header."""
        from rlkit.distributed import broadcast, start_broadcast

        t0 = time.perf_counter()
        length = torch.zeros(1, dtype=torch.int64, device=self.weight_device)
        broadcast(self.weight_group, length)
        if length.item() == 0:
            clock["receive"] += time.perf_counter() - t0
            return None
        raw = torch.empty(int(length.item()), dtype=torch.uint8, device=self.weight_device)
        broadcast(self.weight_group, raw)
        clock["receive"] += time.perf_counter() - t0
        specs = decode_header(raw.cpu())
        flat = self._buffer(slot, specs[-1].offset + specs[-1].nbytes)
        return specs, [start_broadcast(self.weight_group, flat[s.offset:s.offset + s.nbytes]) for s in specs], flat

    def _buffer(self, slot: int, nbytes: int) -> torch.Tensor:
        """Receive buffer ``slot``, at least ``nbytes`` long: allocated once and kept (a fresh buffer per
        bucket costs page faults on every refit)."""
        if self.receive_buffers is None:
            self.receive_buffers = [torch.empty(0, dtype=torch.uint8, device=self.weight_device)] * BUCKETS_IN_FLIGHT
        if self.receive_buffers[slot].numel() < nbytes:
            self.receive_buffers[slot] = torch.empty(0, dtype=torch.uint8, device=self.weight_device)  # free first
            self.receive_buffers[slot] = torch.empty(nbytes, dtype=torch.uint8, device=self.weight_device)
        return self.receive_buffers[slot]


class BroadcastWeightSync(CodeRepr):
    """``sync(policy, generator) -> RefitReport`` for the one :class:`rlkit.generation.remote.RemoteGenerator`
    it was built with, whose actor carries a :class:`BroadcastReceiver`."""

    def __init__(self, generator: Any, bucket_bytes: float = 256e6):
        self.generator = generator  # the RemoteGenerator this sync refits (its ``actor`` is the peer)
        self.bucket_bytes = bucket_bytes
        self.group: Optional[Any] = None  # this process's end (rank 0) of the open group
        self._store = None
        self.backend: Optional[str] = None
        self.last_actor_seconds: dict[str, float] = {}  # the actor's side of the last sync: receive, load

    def sync(self, policy: WeightSource, generator: Any) -> RefitReport:
        _check_pair(self, generator)
        return stream_refit(policy, generator, self._send)

    def _send(self, groups: Iterator[HFGroup]) -> int:
        import ray

        buckets = bucket_groups(groups, self.bucket_bytes)
        first = next(buckets, None)
        if first is None:
            return 0
        group = self._open("nccl" if first[0][1].is_cuda else "gloo")
        receiving = self.generator.actor.receive_weights.remote()
        try:
            sent = send_buckets(group, itertools.chain([first], buckets), lambda works: _wait_watching(works, receiving))
            self.last_actor_seconds = ray.get(receiving)
        except BaseException:
            self.close()  # the two ranks may be out of step: open a fresh group next time
            raise
        return sent

    def _open(self, backend: str) -> Any:
        """This process's end of a two-rank group to the actor (rank 1), opened when none is open for ``backend``."""
        import ray

        from rlkit.distributed import host_store, pair_group_on

        if self.group is None or self.backend != backend:
            self.close()
            self._store, (host, port) = host_store(2)  # on a port the OS picks while binding: no race for it
            joined = self.generator.actor.join_weight_group.remote(host, port, backend)
            self.group = pair_group_on(self._store, 0, backend)
            ray.get(joined)
            self.backend = backend
        return self.group

    def close(self) -> None:
        """Forget the group (the actor's end goes away with the actor)."""
        self._store = self.group = self.backend = None

    def __repr__(self) -> str:
        state = f"open ({self.backend})" if self.group is not None else "not connected"
        return f"BroadcastWeightSync(bucket={self.bucket_bytes / 1e6:.0f} MB, group {state})"


def _check_pair(sync: Any, generator: Any) -> None:
    if generator is not sync.generator:
        raise ValueError(f"this {type(sync).__name__} refits {sync.generator!r}, not {generator!r}: build a "
                         "generator and its sync together (rlkit.builders.build_generation)")


@dataclass(frozen=True)
class EnginePeer:
    """A generator engine as a policy rank sees it: the engine actor's handle, which a
    :class:`BroadcastWeightSync` in the rank sends to, and the prefix-cache reset that ends a refit."""

    actor: Any

    def reset_prefix_cache(self) -> None:
        import ray

        ray.get(self.actor.reset_prefix_cache.remote())


class RanksBroadcastWeightSync(CodeRepr):
    """``sync(policy, generator) -> RefitReport`` for a policy whose ranks live in Ray workers
    (:class:`rlkit.policy.workers.RayPolicyGroup`) and a generator in its own actor: rank 0 holds its own
    :class:`BroadcastWeightSync` with the engine (kept for later refits) and streams the buckets while every rank
    takes part in the export's gathers, so the weights never pass through this process. Only the call and
    its report do. :func:`rlkit.builders.build_generation` picks it for such a pair."""

    def __init__(self, generator: Any, bucket_bytes: float = 256e6):
        self.generator = generator
        self.bucket_bytes = bucket_bytes
        self.last_actor_seconds: dict[str, float] = {}  # the actor's side of the last sync: receive, load

    def sync(self, policy: Any, generator: Any) -> RefitReport:
        _check_pair(self, generator)
        report, self.last_actor_seconds = policy.on_ranks(_send_from_rank, EnginePeer(generator.actor),
                                                          self.bucket_bytes)
        return report

    def __repr__(self) -> str:
        return f"RanksBroadcastWeightSync(bucket={self.bucket_bytes / 1e6:.0f} MB, sent by the policy's rank 0)"


def _send_from_rank(kept: dict, policy: Any, rank: int, engine: EnginePeer, bucket_bytes: float):
    """On each policy rank: rank 0 refits the engine through the sync it keeps (a new one for another engine
    or bucket size) and returns the report and the engine's seconds; the other ranks take part in the export."""
    if rank != 0:
        for _ in policy.export_hf_groups():
            pass
        return None
    sync = kept.get("weight_sync")
    if sync is None or sync.generator.actor != engine.actor or sync.bucket_bytes != bucket_bytes:
        sync = kept["weight_sync"] = BroadcastWeightSync(engine, bucket_bytes)
    report = sync.sync(policy, sync.generator)
    return report, dict(sync.last_actor_seconds)


def _wait_watching(works: list, receiving: Any) -> None:
    """Wait for ``works`` while watching the actor's call: an actor that fails raises here instead of leaving
    this process blocked in a broadcast until the group's timeout. Waits on completion callbacks, not by
    polling (a polling loop takes CPU from the actor's reload on a busy machine)."""
    import ray

    watch = receiving.future()
    for work in works:
        sent, woken = work.get_future(), threading.Event()
        sent.add_done_callback(lambda _: woken.set())
        watch.add_done_callback(lambda _: woken.set())
        woken.wait()
        if not sent.done():  # the actor's call ended first
            ray.get(receiving)  # raises the actor's error; else the actor has everything and this send ends
        work.wait()
