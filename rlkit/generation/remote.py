"""vLLM in its own process (a Ray actor), behind the same Generator protocol as the in-process engine.

Why a separate process: generation and training then run at the same time (async GRPO), and on GPU
machines the engine gets its own devices. The actor wraps the in-process :class:`VllmGenerator`, so
sampling, seeds and the logprob convention are exactly those of colocated runs.

Weights reach the actor two ways:

* ``update_weights(bucket)``: tensors travel through Ray's object store (what ``ColocatedWeightSync``
  uses when handed this generator; simple, and fine for small models).
* a broadcast over a dedicated two-rank process group (driver rank 0, actor rank 1; gloo on CPU, NCCL on
  GPU), driven by :class:`rlkit.weight_sync.BroadcastWeightSync`: the actor is told a bucket's names,
  shapes and dtypes by a Ray call, receives the bytes by broadcast into one flat buffer, and reloads them.

Deliberate simplifications: one engine actor (no data-parallel generation); the driver relays weights
(a Ray worker-group policy exports to the driver, which broadcasts), rather than policy rank 0 broadcasting
to the engine directly; a failed actor is not restarted (build a new generator).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

import torch

from rlkit.config.components import GenerationConfig
from rlkit.generation.base import Generation, SamplingSettings

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


def unpack_bucket(flat: torch.Tensor, specs: list[TensorSpec]) -> list[tuple[str, torch.Tensor]]:
    """Views into ``flat`` with the names, shapes and dtypes of ``specs`` (no copy)."""
    return [(s.name, flat[s.offset:s.offset + s.nbytes].view(s.dtype).view(s.shape)) for s in specs]


class _GeneratorActor:
    """The actor: one in-process vLLM engine, plus the receiving end of the weight broadcast."""

    def __init__(self, model_path: str, cfg: GenerationConfig, max_model_len: int, seed: int):
        from rlkit.generation.vllm import VllmGenerator

        self.generator = VllmGenerator(model_path, cfg, max_model_len=max_model_len, seed=seed)
        self._store = self._group = None
        self._device = "cpu"

    def info(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                "cuda": torch.cuda.is_available()}

    def generate(self, prompt_token_ids: list[list[int]], n: int, sampling: SamplingSettings) -> Generation:
        return self.generator.generate(prompt_token_ids, n, sampling)

    def update_weights(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        self.generator.update_weights(bucket)

    def reset_prefix_cache(self) -> None:
        self.generator.reset_prefix_cache()

    def join_weight_group(self, host: str, port: int, backend: str) -> None:
        from rlkit.distributed import pair_group

        self._store, self._group = pair_group(host, port, rank=1, backend=backend)
        self._device = "cuda" if backend == "nccl" else "cpu"

    def receive_bucket(self, specs: list[TensorSpec], nbytes: int) -> tuple[float, float]:
        """Receive one bucket from rank 0, one broadcast per tensor straight into its place in a flat
        buffer (the sender needs no packing copy), and load it; returns (receive, load) seconds."""
        from rlkit.distributed import start_broadcast

        t0 = time.perf_counter()
        flat = self._buffer(nbytes)
        works = [start_broadcast(self._group, flat[s.offset:s.offset + s.nbytes], root=0) for s in specs]
        for work in works:
            work.wait()
        t1 = time.perf_counter()
        self.generator.update_weights(unpack_bucket(flat, specs))
        return t1 - t0, time.perf_counter() - t1

    def receive_bytes(self, nbytes: int) -> int:
        """Receive a broadcast of ``nbytes`` and discard it: the transport alone, for benchmarks."""
        return self._receive(nbytes).numel()

    def _receive(self, nbytes: int) -> torch.Tensor:
        from rlkit.distributed import broadcast

        flat = self._buffer(nbytes)
        broadcast(self._group, flat, root=0)
        return flat

    def _buffer(self, nbytes: int) -> torch.Tensor:
        if self._group is None:
            raise RuntimeError("no weight group: the driver must call open_weight_group() first")
        return torch.empty(nbytes, dtype=torch.uint8, device=self._device)

    def close(self) -> None:
        self._store = self._group = None
        if self.generator is not None:
            self.generator.close()
            self.generator = None


class RemoteGenerator:
    """A vLLM engine in a Ray actor presenting the Generator protocol (generate, update_weights,
    reset_prefix_cache, close). Starts a local Ray instance when none is up, and then shuts it down on
    ``close()``. ``threads``: OpenMP threads of the actor (CPU only; default half the cores, so the trainer
    and the engine can run side by side)."""

    def __init__(self, model_path: str | Path, cfg: GenerationConfig, max_model_len: int, seed: int = 0,
                 ray_address: Optional[str] = None, threads: Optional[int] = None):
        import ray

        from rlkit.distributed import actor_env, ensure_ray

        self.model_path = str(model_path)
        self.max_model_len = max_model_len
        self.actor = None
        self.info: dict[str, Any] = {}
        self._closed = False
        cores = os.cpu_count() or 1
        self.threads = threads or max(1, cores // 2)
        self._started_ray = ensure_ray(ray_address, num_cpus=cores)
        try:
            on_gpu = torch.cuda.is_available()
            # num_cpus=0: the engine's threads are set by OMP_NUM_THREADS, and a CPU slot must not be taken
            # from the policy workers that share this Ray instance (they reserve one per rank).
            actor = ray.remote(_GeneratorActor).options(
                num_cpus=0, num_gpus=1 if on_gpu else 0,
                runtime_env={"env_vars": actor_env(self.threads)},
            )
            self.actor = actor.remote(self.model_path, cfg, max_model_len, seed)
            self.info = ray.get(self.actor.info.remote())
        except BaseException:
            self.close()
            raise

    # ---- the Generator protocol -------------------------------------------------------------------
    def generate(self, prompt_token_ids: list[list[int]], n: int, sampling: SamplingSettings) -> Generation:
        return self.wait(self.actor.generate.remote([list(p) for p in prompt_token_ids], n, sampling))

    def update_weights(self, bucket: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.wait(self.actor.update_weights.remote([(n, t.detach().cpu()) for n, t in bucket]))

    def reset_prefix_cache(self) -> None:
        self.wait(self.actor.reset_prefix_cache.remote())

    # ---- the receiving side of BroadcastWeightSync -------------------------------------------------
    def open_weight_group(self, backend: str = "gloo") -> tuple[Any, Any]:
        """(store, group): the driver's rank-0 end of a new two-rank group whose rank 1 is the actor."""
        from rlkit.distributed import free_address, pair_group

        host, port = free_address()
        joined = self.actor.join_weight_group.remote(host, port, backend)
        store, group = pair_group(host, port, rank=0, backend=backend)
        self.wait(joined)
        return store, group

    def receive_bucket(self, specs: list[TensorSpec], nbytes: int):
        """Ask the actor to receive (by broadcast) and load one bucket; returns a Ray reference."""
        return self.actor.receive_bucket.remote(specs, nbytes)

    def receive_bytes(self, nbytes: int):
        """Ask the actor to receive and discard a broadcast of ``nbytes`` (transport baseline)."""
        return self.actor.receive_bytes.remote(nbytes)

    @staticmethod
    def wait(ref: Any) -> Any:
        """The result of an actor call; its exception (with the actor's traceback) if it failed."""
        import ray

        return ray.get(ref)

    # ---- lifecycle --------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the engine and kill the actor (and Ray, if this generator started it). Safe twice."""
        if self._closed:
            return
        self._closed = True
        import ray

        if self.actor is not None:
            try:
                ray.wait([self.actor.close.remote()], timeout=30)
            finally:
                ray.kill(self.actor)
                self.actor = None
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"pid {self.info.get('pid')}, {self.threads} thread(s)"
        return f"RemoteGenerator({Path(self.model_path).name}, Ray actor, {state})"

    def _repr_html_(self) -> str:
        import html

        return f"<code>{html.escape(repr(self))}</code>"
