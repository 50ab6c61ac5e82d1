"""Process groups for the Megatron policy: torch.distributed plus Megatron's global parallel state.

Megatron keeps its parallel layout in module-level globals, so only one layout can be live per process.
:func:`init_parallel` sets it up, :func:`destroy_parallel` tears it down so that a new Session in the same
notebook kernel can build a fresh one.

Who creates which group, and who destroys it (each gloo group runs two worker threads and a transport loop,
and the default group's rendezvous store a server thread and sockets, so a group left alive leaks them):

- the default group: :func:`acquire_process_group` creates it for the first in-process policy (from
  ``RANK``/``WORLD_SIZE`` in a Ray worker, else a single-process gloo group, its store in memory) and destroys
  it when its last holder releases it (:func:`release_process_group`); one that was there before (your
  script's) is left alone.
  vLLM's in-process engine uses the group it finds, and its shutdown destroys the default group whoever made
  it (vLLM's ``cleanup_dist_env_and_memory``); a release after that has nothing left to do.
- Megatron's subgroups: made by ``initialize_model_parallel``; :func:`destroy_parallel` drops every reference
  Megatron keeps to them, so they end with the model that used them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from rlkit.policy.megatron.cpu import apply_cpu_fallbacks


@dataclass(frozen=True)
class ParallelLayout:
    """Megatron parallel sizes (NeMo-RL's ``policy.megatron_cfg`` names); data parallel takes the rest."""

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    context_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: int | None = None
    sequence_parallel: bool = False


_created_group = None  # the default group acquire_process_group() created, until its last holder releases it
_holders = 0  # acquire_process_group() calls not yet released


def acquire_process_group() -> None:
    """A default torch.distributed group exists, held for the caller until its :func:`release_process_group`:
    the one already there (a launcher's, or one acquired before), or a new one from ``RANK``/``WORLD_SIZE``
    (a Ray worker), or else a single-process gloo group."""
    global _created_group, _holders
    if not dist.is_initialized():
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        else:
            # one process needs no rendezvous: an in-memory store, no port (a port picked free and bound later
            # could be taken in between by another process starting a group)
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        _created_group = dist.group.WORLD
    _holders += 1


def release_process_group() -> None:
    """Undo one :func:`acquire_process_group`; the last release destroys the default group if it is the one
    acquiring created (it may be gone already: vLLM's engine shutdown destroys it)."""
    global _created_group, _holders
    _holders = max(0, _holders - 1)
    if _holders == 0 and _created_group is not None:
        if dist.is_initialized() and dist.group.WORLD is _created_group:
            dist.destroy_process_group()
        _created_group = None


def init_parallel(layout: ParallelLayout, seed: int) -> None:
    """Initialise Megatron's parallel state for ``layout`` and seed its RNG tracker. Acquires the default
    group for the caller, who releases it (:func:`release_process_group`) after :func:`destroy_parallel`."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    apply_cpu_fallbacks()
    acquire_process_group()
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=layout.tensor_model_parallel_size,
        pipeline_model_parallel_size=layout.pipeline_model_parallel_size,
        context_parallel_size=layout.context_parallel_size,
        expert_model_parallel_size=layout.expert_model_parallel_size,
        expert_tensor_parallel_size=layout.expert_tensor_parallel_size,
    )
    model_parallel_cuda_manual_seed(seed)


def device() -> torch.device:
    """This rank's device: its GPU (NCCL) or the CPU (gloo)."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def destroy_parallel() -> None:
    """Tear down Megatron's parallel state and drop every reference it keeps to a process group."""
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    _drop_megatron_group_references(parallel_state)


def _drop_megatron_group_references(parallel_state) -> None:
    """Megatron-Core 0.16 keeps two process groups beyond ``destroy_model_parallel()``: that function leaves
    ``_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP`` (and its ``_GLOO`` twin) set, and ``RotaryEmbedding.forward``
    is an ``lru_cache`` on a method, whose keys hold the model's rotary module and with it its ``cp_group``.
    Either keeps the group's threads and the rendezvous store's sockets alive after the model is gone (a
    notebook gained 4 threads and 13 files per session). No public call releases them, so the globals that
    still hold a group are reset here and the caches cleared (they only save recomputing the rotary table)."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import YarnRotaryEmbedding

    for name, value in list(vars(parallel_state).items()):
        if isinstance(value, dist.ProcessGroup):
            setattr(parallel_state, name, None)
    for rotary in (RotaryEmbedding, YarnRotaryEmbedding):
        rotary.forward.cache_clear()


def is_expert_parallel(param) -> bool:
    """True for a parameter of an expert that only some ranks hold (Megatron marks them ``allreduce=False``)."""
    return not getattr(param, "allreduce", True)
