"""Process groups for the Megatron policy: torch.distributed plus Megatron's global parallel state.

Megatron keeps its parallel layout in module-level globals, so only one layout can be live per process.
:func:`init_parallel` sets it up (creating a single-process gloo group when nothing else did; vLLM's
in-process engine creates the same kind and Megatron reuses it), :func:`destroy_parallel` tears
Megatron's state down so that a new Session in the same notebook kernel can build a fresh one.
"""

from __future__ import annotations

import os
import socket
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

    def model_parallel_size(self) -> int:
        return self.tensor_model_parallel_size * self.pipeline_model_parallel_size * self.context_parallel_size


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_process_group() -> None:
    """A torch.distributed group exists: the launcher's (env://), or a single-process gloo group."""
    if dist.is_initialized():
        return
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        return
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)


def init_parallel(layout: ParallelLayout, seed: int) -> None:
    """Initialise Megatron's parallel state for ``layout`` and seed its RNG tracker."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    apply_cpu_fallbacks()
    ensure_process_group()
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
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()


def tp_group():
    from megatron.core import parallel_state

    return parallel_state.get_tensor_model_parallel_group()


def tp_rank_and_size() -> tuple[int, int]:
    from megatron.core import parallel_state

    return parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_tensor_model_parallel_world_size()


def dp_group():
    from megatron.core import parallel_state

    return parallel_state.get_data_parallel_group()


def dp_size() -> int:
    from megatron.core import parallel_state

    return parallel_state.get_data_parallel_world_size()


def ep_rank_and_size() -> tuple[int, int]:
    """This rank's place in the expert-parallel group (experts are split over its ranks)."""
    from megatron.core import parallel_state

    return parallel_state.get_expert_model_parallel_rank(), parallel_state.get_expert_model_parallel_world_size()


def etp_rank_and_size() -> tuple[int, int]:
    """This rank's place in the expert-tensor-parallel group (each expert's weights are split over it)."""
    from megatron.core import parallel_state

    return parallel_state.get_expert_tensor_parallel_rank(), parallel_state.get_expert_tensor_parallel_world_size()


def etp_group():
    from megatron.core import parallel_state

    return parallel_state.get_expert_tensor_parallel_group()


def expert_model_group():
    """The ranks that together hold one copy of every expert (expert-tensor x expert-parallel)."""
    from megatron.core import parallel_state

    return parallel_state.get_expert_tensor_and_model_parallel_group()


def ep_group():
    from megatron.core import parallel_state

    return parallel_state.get_expert_model_parallel_group()


def is_expert_parallel(param) -> bool:
    """True for a parameter of an expert that only some ranks hold (Megatron marks them ``allreduce=False``)."""
    return not getattr(param, "allreduce", True)


def grad_reduce_group(param):
    """The ranks that hold ``param`` and see different data: the data-parallel group, or for an expert split
    by expert parallelism the expert-data-parallel group (the ranks that hold the same experts)."""
    from megatron.core import parallel_state

    if is_expert_parallel(param):
        return parallel_state.get_expert_data_parallel_group()
    return parallel_state.get_data_parallel_group()
