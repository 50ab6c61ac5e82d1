"""Process groups for the Megatron policy: torch.distributed plus Megatron's global parallel state.

Megatron keeps its parallel layout in module-level globals, so only one layout can be live per process.
:func:`init_parallel` sets it up, :func:`destroy_parallel` tears it down so that a new Session in the same
notebook kernel can build a fresh one; a second model in the same layout (a distillation teacher) shares it, and
the last of them to close tears it down.

The default group is :mod:`rlkit.policy.process_group`'s (acquired for the policy, released on close).
Megatron's subgroups: made by ``initialize_model_parallel``; :func:`destroy_parallel` drops every reference
Megatron keeps to them, so they end with the model that used them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from rlkit import rng
from rlkit.policy.megatron.cpu import apply_cpu_fallbacks
from rlkit.policy.process_group import acquire_process_group, release_process_group  # noqa: F401 - (re-exported)


# the state init_parallel made: its generation, its layout and the models holding it (none: not made here)
_live: dict = {"generation": 0, "layout": None, "holders": 0}


@dataclass(frozen=True)
class ParallelLayout:
    """Megatron parallel sizes (NeMo-RL's ``policy.megatron_cfg`` names); data parallel takes the rest."""

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    context_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: int | None = None
    sequence_parallel: bool = False


def init_parallel(layout: ParallelLayout, seed: int) -> int:
    """Initialise Megatron's parallel state for ``layout`` (or, when a live model holds it in the same layout: a
    distillation teacher beside the policy, join it) and seed its RNG tracker. Returns the state's generation,
    for :func:`destroy_parallel`. Acquires the default group for the caller, who releases it
    (:func:`release_process_group`) after :func:`destroy_parallel`."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    apply_cpu_fallbacks()
    acquire_process_group()
    if _live["holders"] and _live["layout"] == layout and parallel_state.model_parallel_is_initialized():
        _live["holders"] += 1
    else:
        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=layout.tensor_model_parallel_size,
            pipeline_model_parallel_size=layout.pipeline_model_parallel_size,
            context_parallel_size=layout.context_parallel_size,
            expert_model_parallel_size=layout.expert_model_parallel_size,
            expert_tensor_parallel_size=layout.expert_tensor_parallel_size,
        )
        _live.update(generation=_live["generation"] + 1, layout=layout, holders=1)
    model_parallel_cuda_manual_seed(seed)
    return _live["generation"]


def device() -> torch.device:
    """This rank's device: its GPU (NCCL) or the CPU (gloo)."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def destroy_parallel(generation: int | None = None) -> None:
    """Tear down Megatron's parallel state and drop every reference it keeps to a process group. With the
    ``generation`` :func:`init_parallel` returned: only when its last holder lets go, and nothing once a newer
    state replaced it."""
    from megatron.core import parallel_state

    if generation is not None:
        if generation != _live["generation"]:
            return
        _live["holders"] -= 1
        if _live["holders"] > 0:
            return
    _live.update(layout=None, holders=0)
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    _drop_megatron_group_references(parallel_state)


def _drop_megatron_group_references(parallel_state) -> None:
    """Megatron-Core 0.16 keeps two process groups beyond ``destroy_model_parallel()``: that function leaves
    ``_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP`` (and its ``_GLOO`` twin) set, and ``RotaryEmbedding.forward``
    is an ``lru_cache`` on a method, whose keys hold the model's rotary module and with it its ``cp_group``.
    Either keeps the group's threads and the rendezvous store's sockets alive after the model is gone. No public
    call releases them, so the globals that still hold a group are reset here and the caches cleared (they only
    save recomputing the rotary table)."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import YarnRotaryEmbedding

    for name, value in list(vars(parallel_state).items()):
        if isinstance(value, dist.ProcessGroup):
            setattr(parallel_state, name, None)
    for rotary in (RotaryEmbedding, YarnRotaryEmbedding):
        rotary.forward.cache_clear()


def _seed_tracker(seed: int) -> None:
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    if parallel_state.model_parallel_is_initialized():
        model_parallel_cuda_manual_seed(seed)


def _live_tracker():
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    tracker = get_cuda_rng_tracker()
    return tracker if tracker.is_initialized() else None


# Megatron's tracked RNG states (dropout per tensor-parallel rank) are seeded, saved and restored with the rest
rng.register_tracker("megatron", rng.Tracker(
    seed=_seed_tracker, get_states=lambda: (t.get_states() if (t := _live_tracker()) else None),
    set_states=lambda states: _live_tracker().set_states(states)))
