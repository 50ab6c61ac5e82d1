"""Per-token logprobs and entropy from vocabulary-parallel logits, without gathering the vocabulary.

With tensor parallelism each rank holds logits ``[b, T, V/tp]``. Logprobs go through Megatron's
``vocab_parallel_cross_entropy`` (autograd-aware, all-reduces only ``[b, T]`` statistics); entropy is a
metric, so it is computed without grad from three all-reduced statistics: max, sum of exp, and sum of
exp * logit. At TP=1 the all-reduces are no-ops over a group of one.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor


def shifted_token_logprobs(logits: Tensor, input_ids: Tensor) -> Tensor:
    """logits [b, T, V/tp] (position t predicts token t+1), input_ids [b, T] -> logprobs [b, T].

    Output position t holds log p(input_ids[:, t] | input_ids[:, :t]); position 0 holds 0.

    The logits are consumed: Megatron's ``vocab_parallel_cross_entropy`` works in place, turning its input into
    the softmax its backward keeps. Contiguous fp32 logits (what the model returns) are handed over as they are,
    every position with a target (the last one, which predicts nothing, gets id 0 and is dropped), so the
    [b, T, V/tp] logits are not copied; bf16 or strided logits are copied once. Read nothing from ``logits``
    after this call (the entropy is computed first).
    """
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    targets = torch.nn.functional.pad(input_ids[:, 1:], (0, 1))  # [b, T]
    nll = vocab_parallel_cross_entropy(logits.to(torch.float32).contiguous(), targets.contiguous())
    return torch.nn.functional.pad(-nll[:, :-1], (1, 0))


ENTROPY_CHUNK_BYTES = 256 * 2**20  # fp32 working copies of the logits the entropy holds at once


@torch.no_grad()
def shifted_entropy(logits: Tensor, group) -> Tensor:
    """logits [b, T, V/tp] -> entropy [b, T] of the distribution that predicted each token (position 0: 0).

    Rows go through in chunks of at most :data:`ENTROPY_CHUNK_BYTES` of fp32 logits, so its working copies
    (``exp(z - max)`` and ``e * z``) cost a chunk, not two more copies of the whole [b, T, V/tp] logits. Each row's
    statistics are reduced over its own vocabulary only, so the result does not depend on the chunking."""
    b, t, v = logits.shape
    rows = max(1, ENTROPY_CHUNK_BYTES // max(1, (t - 1) * v * 4))
    pieces = []
    for start in range(0, b, rows):
        z = logits[start:start + rows, :-1].float()
        z_max = z.max(dim=-1).values
        dist.all_reduce(z_max, op=dist.ReduceOp.MAX, group=group)
        e = torch.exp(z - z_max.unsqueeze(-1))
        sum_e = e.sum(dim=-1)
        sum_ez = (e * z).sum(dim=-1)
        dist.all_reduce(sum_e, group=group)
        dist.all_reduce(sum_ez, group=group)
        pieces.append(z_max + torch.log(sum_e) - sum_ez / sum_e)
    return torch.nn.functional.pad(torch.cat(pieces), (1, 0))
