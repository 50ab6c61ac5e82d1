"""vLLM in its own process (a Ray actor), behind the same Generator protocol as the in-process engine.

Why a separate process: generation and training then run at the same time (async GRPO), and on GPU
machines the engine gets its own devices. The actor is the in-process :class:`VllmGenerator`, so sampling,
seeds and the logprob convention are exactly those of colocated runs.

The actor samples token ids and logprobs; this process decodes them into texts (:func:`decode_completions`),
so the engine's process, which async GRPO waits on, does only the engine's work. Beyond that the generator
only loads the tensors it is handed (``update_weights``: they travel through Ray's object store; simple, and
fine for small models). A faster transport brings its own receiving end as
``actor_extension``, a class mixed into the actor (vLLM's ``worker_extension_cls`` pattern), and calls it
through the public ``actor`` handle: :class:`rlkit.weight_sync.BroadcastWeightSync` does so with
:class:`rlkit.weight_sync.BroadcastReceiver`. So a transport's code lives with the transport, and
:func:`rlkit.builders.build_generation` builds the generator and its weight sync as one pair.

Deliberate simplifications: one engine actor (no data-parallel generation), which reserves no CPU and is not
part of the policy's placement group (Ray puts it where it fits; it reads the model folder at the driver's
path); a failed actor is not restarted (build a new generator). A Ray worker-group policy is refit from its
rank 0 directly (:class:`rlkit.weight_sync.RanksBroadcastWeightSync`), not through the driver.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Optional

import ray
import torch
from transformers import AutoTokenizer

from rlkit.config.components import GenerationConfig
from rlkit.cluster import worker_env_vars
from rlkit.distributed import ensure_ray
from rlkit.generation.base import Generation, KeepsItsMemory, SamplingSettings
from rlkit.generation.vllm import VllmGenerator, decode_completions
from rlkit.notebook.html import CodeRepr


class _EngineActor(VllmGenerator):
    """The actor: the in-process engine itself (an actor extension loads into it), and where it runs."""

    def info(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                "cuda": torch.cuda.is_available(), "node_id": ray.get_runtime_context().get_node_id()}


def split_cores(cores: int, engine_threads: int) -> int:
    """Give this process's torch the ``cores`` an engine on the same CPU does not take; returns the former count.

    Why: async GRPO trains while the engine samples, and an OpenMP parallel region waits for its slowest thread.
    With more threads than cores, the trainer's threads are descheduled in turn and every region waits
    (figures: docs/measurements.md, ``bench/async_vs_sync.py``)."""
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, cores - engine_threads))
    return before


class RemoteGenerator(CodeRepr, KeepsItsMemory):
    """A vLLM engine in a Ray actor presenting the Generator protocol (generate, update_weights,
    reset_prefix_cache, close). Starts a local Ray instance when none is up, and then shuts it down on
    ``close()``. ``threads``: OpenMP threads of the actor (CPU only; default half the cores). When the engine
    shares this machine's CPU, this process's torch threads become the cores the engine does not take, until
    ``close()`` (see :func:`split_cores`). ``actor_extension``: a transport's receiving end, mixed into the
    actor class (no ``__init__`` of its own; ``self`` is the engine, a :class:`VllmGenerator`)."""

    def __init__(self, model_path: str | Path, cfg: GenerationConfig, max_model_len: int, seed: int = 0,
                 ray_address: Optional[str] = None, threads: Optional[int] = None,
                 actor_extension: Optional[type] = None):
        self.model_path = str(Path(model_path).resolve())  # the driver's folder, wherever the actor's node started
        self.max_model_len = max_model_len
        self.actor = None
        self.info: dict[str, Any] = {}
        self._closed = False
        self._threads_before: Optional[int] = None
        cores = os.cpu_count() or 1
        self.threads = threads or max(1, cores // 2)
        self._started_ray = ensure_ray(ray_address, num_cpus=cores)
        try:
            on_gpu = torch.cuda.is_available()
            # num_cpus=0: the engine's threads are set by OMP_NUM_THREADS, and a CPU slot must not be taken
            # from the policy workers that share this Ray instance (they reserve one per rank).
            cls = _EngineActor if actor_extension is None else type(
                f"EngineActor_{actor_extension.__name__}", (_EngineActor, actor_extension), {})
            actor = ray.remote(cls).options(
                num_cpus=0, num_gpus=1 if on_gpu else 0,
                runtime_env={"env_vars": worker_env_vars(self.threads)},
            )
            self.actor = actor.remote(self.model_path, cfg, max_model_len, seed)
            self.info = ray.get(self.actor.info.remote())
            self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)  # the folder's, as the engine loads it
            if not on_gpu and self.info["node_id"] == ray.get_runtime_context().get_node_id():
                self._threads_before = split_cores(cores, self.threads)
        except BaseException:
            self.close()
            raise

    # ---- the Generator protocol -------------------------------------------------------------------
    def generate(self, prompt_token_ids: list[list[int]], n: int, sampling: SamplingSettings) -> Generation:
        # the engine samples, this process decodes (the engine's process is async GRPO's bottleneck)
        generation = ray.get(self.actor.sample.remote([list(p) for p in prompt_token_ids], n, sampling))
        return decode_completions(generation, self.tokenizer)

    def update_weights(self, bucket: Iterable[tuple[str, torch.Tensor]]) -> None:
        ray.get(self.actor.update_weights.remote([(n, t.detach().cpu()) for n, t in bucket]))

    def reset_prefix_cache(self) -> None:
        ray.get(self.actor.reset_prefix_cache.remote())

    # ---- lifecycle --------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the engine and kill the actor (and Ray, if this generator started it). Safe twice."""
        if self._closed:
            return
        self._closed = True
        if self._threads_before is not None:
            torch.set_num_threads(self._threads_before)
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
