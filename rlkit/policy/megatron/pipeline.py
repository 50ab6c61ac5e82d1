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
from collections import Counter
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core.pipeline_parallel import get_forward_backward_func
from torch import Tensor

from rlkit.policy.base import TokenLogprobs
from rlkit.policy.megatron.cpu import cuda_literals_on_cpu
from rlkit.policy.megatron.parallel import device
from rlkit.trajectories import Trajectories

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


class PipelineSchedule:
    """The microbatch loop of a policy split into pipeline stages (a model adapter's ``pipeline``): the loop of
    :class:`rlkit.policy.in_process.InProcessPolicy` hands over its own functions (the forward length, the scores of
    logits, a microbatch's loss) and gets every stage the last stage's results.

    ``module``: this stage's model as the schedule runs it (DDP around it); ``stage_forward(ids [b, t'])`` runs this
    stage on already padded ids; ``padded_length(t)`` is the length a forward pass of ``t`` columns runs at."""

    def __init__(self, module, stage_forward: Callable[[Tensor], Tensor], padded_length: Callable[[int], int]):
        self.module, self.stage_forward, self.padded_length = module, stage_forward, padded_length

    def logprobs(self, input_ids: Tensor, attention_mask: Tensor, with_entropy: bool, rows_per_micro: int,
                 forward_length: Callable[[Tensor], int],
                 scores: Callable[[Tensor, Tensor, bool], tuple[Tensor, Optional[Tensor]]]) -> TokenLogprobs:
        """Logprobs (and entropy) [B, T] of ``input_ids`` [B, T] with ``scores(logits, ids, with_entropy)``: equal
        microbatches (the last row repeated to fill the last one), one length ``forward_length(mask)``; 0 at
        position 0 and on padding."""
        b, width = input_ids.shape
        rows = min(rows_per_micro, b)
        fill = -b % rows
        ids_all = torch.cat([input_ids, input_ids[-1:].expand(fill, -1)])
        mask_all = torch.cat([attention_mask, attention_mask[-1:].expand(fill, -1)])
        t = forward_length(mask_all)
        ids_all, mask_all = ids_all[:, :t], mask_all[:, :t]
        padded = torch.nn.functional.pad(ids_all, (0, self.padded_length(t) - t))
        micros = [slice(s, s + rows) for s in range(0, b + fill, rows)]

        def on_last_stage(output: Tensor, rows_: slice) -> tuple[Tensor, dict]:
            mask = mask_all[rows_]
            lp, ent = scores(output[:, :t], ids_all[rows_], with_entropy)
            lp = lp.to(mask.device) * mask
            if with_entropy:
                lp = torch.stack([lp, ent.to(mask.device) * mask])
            return output.new_zeros(()), {"scores": lp}

        infos = run_schedule(self.module, micros, lambda rows_: self.stage_forward(padded[rows_]), on_last_stage,
                             padded.shape[1], rows, forward_only=True)
        last = ps.get_pipeline_model_parallel_world_size() - 1
        mine = torch.cat([i["scores"] for i in infos], dim=-2) if ps.get_pipeline_model_parallel_rank() == last else None
        out = broadcast_from_stage(mine, last)[..., :b, :].to(input_ids.device)
        out = torch.nn.functional.pad(out, (0, width - t))  # [b, width], or [2, b, width] with the entropy
        return TokenLogprobs(*out) if with_entropy else TokenLogprobs(out)

    def losses(self, batch: Trajectories, rows_per_micro: int, t: int,
               micro_loss: Callable[[Tensor, Trajectories], tuple[Tensor, dict[str, Tensor]]],
               backward: bool) -> tuple[dict[str, Tensor], int]:
        """``micro_loss(logits [b, t, V/tp], micro)`` over equal microbatches of ``batch`` at length ``t``, gradients
        accumulated unless not ``backward``; the metric sums (from the last stage, on every stage) and the number of
        microbatches."""
        mbs = min(rows_per_micro, batch.batch_size)
        if batch.batch_size % mbs:
            raise ValueError(f"pipeline parallelism runs equal microbatches, but this rank's {batch.batch_size} rows "
                             f"are not a multiple of policy.train_micro_batch_size={mbs}; make the per-rank batch "
                             f"(policy.train_global_batch_size / data-parallel size) a multiple of it")
        padded = torch.nn.functional.pad(batch.input_ids[:, :t], (0, self.padded_length(t) - t))
        micros = [slice(s, s + mbs) for s in range(0, batch.batch_size, mbs)]
        if backward:  # (the schedule itself holds DDP's no_sync over all but the last microbatch)
            self.module.zero_grad_buffer()
        infos = run_schedule(self.module, micros, lambda rows: self.stage_forward(padded[rows]),
                             lambda output, rows: micro_loss(output[:, :t], batch.select(rows)),
                             padded.shape[1], mbs, forward_only=not backward)
        sums: Counter[str] = Counter()  # float64 scalar tensors summed over microbatches
        for info in infos:
            sums.update(info)
        return broadcast_from_last_stage(sums), len(micros)
