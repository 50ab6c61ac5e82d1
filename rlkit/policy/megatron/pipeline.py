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
from megatron.core import parallel_state as ps
from torch import Tensor

from rlkit.policy.megatron.cpu import cuda_literals_on_cpu
from rlkit.policy.megatron.parallel import device

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")


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
    group, on = ps.get_pipeline_model_parallel_group(), device()  # NCCL sends device tensors only
    src = dist.get_global_rank(group, owner)
    shape_and_dtype = [None if tensor is None else (tuple(tensor.shape), tensor.dtype)]
    dist.broadcast_object_list(shape_and_dtype, src, group=group, device=on)
    shape, dtype = shape_and_dtype[0]
    tensor = torch.empty(shape, dtype=dtype, device=on) if tensor is None else tensor.to(on).contiguous()
    dist.broadcast(tensor, src, group=group)
    return tensor


def broadcast_from_last_stage(obj: Any) -> Any:
    """A small picklable ``obj`` (metric sums) from the last stage to every stage."""
    group, last = ps.get_pipeline_model_parallel_group(), ps.get_pipeline_model_parallel_world_size() - 1
    box = [obj if ps.get_pipeline_model_parallel_rank() == last else None]
    dist.broadcast_object_list(box, dist.get_global_rank(group, last), group=group)
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
