"""Pipeline parallelism for the Megatron policy: Megatron's own schedule runs the microbatches.

With ``pipeline_model_parallel_size`` = PP each rank builds only its stage's decoder layers (the first stage
also the embedding, the last the final norm and the output layer). Megatron's 1F1B schedule
(``get_forward_backward_func``) passes activations forward and their gradients back between stages; the
policy's forward step and its loss (on the last stage) are the same functions the unpipelined path uses.
The loss comes back already normalised by global counts, so the schedule is told not to rescale it
(``calculate_per_token_loss`` with a token count of 1 per microbatch).

What the other stages need from the last one (logprobs, entropy, metric sums) and what the refit needs from
every stage (each layer's weights) is broadcast over the pipeline group, so every rank returns the same
results and the weight export yields the same groups on every rank.

On the CPU: point-to-point ops unbatched (``batch_p2p_comm=False``: the batched path synchronises CUDA) and
the ``device="cuda"`` literal of the schedule redirected (:func:`rlkit.policy.megatron.cpu.cuda_literals_on_cpu`).
Deliberate simplifications: no virtual (interleaved) stages; layers split evenly over the stages; every
microbatch of a call padded to one length (the schedule's activation shapes are fixed per call).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from rlkit.policy.megatron.cpu import cuda_literals_on_cpu

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")
_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.bool)


def pp_group():
    from megatron.core import parallel_state

    return parallel_state.get_pipeline_model_parallel_group()


def pp_rank_and_size() -> tuple[int, int]:
    from megatron.core import parallel_state

    return parallel_state.get_pipeline_model_parallel_rank(), parallel_state.get_pipeline_model_parallel_world_size()


def stage_layer_offset(config) -> int:
    """Global index of this stage's first decoder layer."""
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    return get_transformer_layer_offset(config)


def with_layer_offset(name: str, offset: int) -> str:
    """``decoder.layers.j.*`` (this stage's numbering) -> ``decoder.layers.{offset + j}.*``."""
    if offset == 0:
        return name
    return _LAYER.sub(lambda m: f"decoder.layers.{offset + int(m.group(1))}.", name)


def owner_stage(global_name: str, num_layers: int, num_stages: int) -> int:
    """The pipeline stage that holds Megatron parameter ``global_name`` (layers split evenly)."""
    match = _LAYER.match(global_name)
    if match:
        return int(match.group(1)) // (num_layers // num_stages)
    return 0 if global_name.startswith("embedding.") else num_stages - 1


def broadcast_from_stage(tensor: Optional[Tensor], owner: int) -> Tensor:
    """``tensor`` from stage ``owner`` of the pipeline group on every stage (others pass None)."""
    from rlkit.policy.megatron.parallel import device

    group, on = pp_group(), device()  # NCCL sends device tensors only
    src = dist.get_global_rank(group, owner)
    header = torch.full((6,), -1, dtype=torch.int64)  # [dtype code, ndim, d0, d1, d2, d3]
    if tensor is not None:
        header[0], header[1] = _DTYPES.index(tensor.dtype), tensor.dim()
        header[2:2 + tensor.dim()] = torch.tensor(tensor.shape)
    header = header.to(on)
    dist.broadcast(header, src, group=group)
    if tensor is None:
        header = header.cpu()
        tensor = torch.empty(header[2:2 + int(header[1])].tolist(), dtype=_DTYPES[int(header[0])], device=on)
    else:
        tensor = tensor.to(on).contiguous()
    dist.broadcast(tensor, src, group=group)
    return tensor


def broadcast_from_last_stage(obj: Any) -> Any:
    """A small picklable ``obj`` (metric sums) from the last stage to every stage."""
    rank, size = pp_rank_and_size()
    box = [obj if rank == size - 1 else None]
    dist.broadcast_object_list(box, dist.get_global_rank(pp_group(), size - 1), group=pp_group())
    return box[0]


def run_schedule(model, microbatches: Sequence[Any], forward: Callable[[Any], Tensor],
                 on_last_stage: Callable[[Tensor, Any], tuple[Tensor, dict]], seq_length: int,
                 micro_batch_size: int, forward_only: bool) -> list[dict]:
    """Run ``microbatches`` through the pipeline with Megatron's schedule.

    ``forward(micro)`` runs this stage's model on a microbatch (the schedule feeds the previous stage's
    activations in); ``on_last_stage(output, micro) -> (loss, info)`` turns the last stage's output into the
    loss to back-propagate (already normalised) and a dict to keep. Returns the ``info`` dicts in
    microbatch order on the last stage, ``[]`` on the others. Gradients accumulate in ``.grad`` unless
    ``forward_only``.
    """
    from megatron.core.pipeline_parallel import get_forward_backward_func

    def forward_step(data_iterator, _model):
        micro = next(data_iterator)

        def loss_func(output):
            loss, info = on_last_stage(output, micro)
            return loss, torch.tensor(1, dtype=torch.int), info

        return forward(micro), loss_func

    with cuda_literals_on_cpu():
        return get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(microbatches), model=[model],
            num_microbatches=len(microbatches), seq_length=seq_length, micro_batch_size=micro_batch_size,
            forward_only=forward_only,
        )
