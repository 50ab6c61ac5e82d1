"""The output layer and the per-token logprobs in one pass over chunks of tokens: the [tokens, V/tp] logits are
never held whole, in the forward pass or in backward.

The model runs with its head switched off (:func:`hidden_states_out`) and returns the final norm's output; this
module then multiplies chunks of it by the output weight (the embedding's when tied), takes each token's
logprob of its target and the vocabulary-parallel log-sum-exp (three ``[chunk]`` all-reduces over the
tensor-parallel group), and keeps only the log-sum-exp. Backward recomputes the logits a slice of the vocabulary
at a time to get the softmax. Where the unfused head holds its fp32 logits, the softmax its cross-entropy keeps and
their gradient, a chunk or slice here is at most ``chunk_bytes`` (``policy.megatron_cfg.fused_head_chunk_mib``).
Numerics are those of the unfused head: the matmul in the weight's dtype, logits in fp32, divided by the sampling
temperature, the gradient cast to the weight's dtype for the two backward matmuls.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch
import torch.distributed as dist
from megatron.core.tensor_parallel.mappings import (
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
)
from torch import Tensor


@contextlib.contextmanager
def hidden_states_out(gpt):
    """While open, Megatron's ``GPTModel`` ``gpt`` returns the final norm's output [s(/tp), b, h] instead of
    logits (its ``post_process`` flag, which past construction gates the head alone)."""
    gpt.post_process = False
    try:
        yield
    finally:
        gpt.post_process = True


def output_weight(gpt) -> Tensor:
    """The head's weight [V/tp, h]: the input embedding's when the two are tied."""
    return gpt.shared_embedding_or_output_weight() if gpt.share_embeddings_and_output_weights else gpt.output_layer.weight


def head_scores(hidden: Tensor, weight: Tensor, input_ids: Tensor, temperature: float, sequence_parallel: bool,
                with_entropy: bool, chunk_bytes: int,
                scored: Optional[Tensor] = None) -> tuple[Tensor, Optional[Tensor]]:
    """hidden [s(/tp), b, h] (the final norm's output; split over TP ranks under sequence parallelism), this
    rank's head weight [V/tp, h], input_ids [b, s] -> logprobs [b, s] (position t: log p(input_ids[t] | ...),
    position 0: 0; differentiable w.r.t. ``hidden`` and ``weight``) and, with ``with_entropy``, the entropy
    [b, s] of the distribution that predicted each token (position 0: 0; no gradient), else None. No working
    tensor of the logits' size exceeds ``chunk_bytes``. With ``scored`` [b, s] (bool), only the positions it marks
    get logits (a completion's tokens, say: the prompt's are most of a short reply's row); the others' logprobs
    and entropy are 0 and pass no gradient.

    The hidden states enter through the mapping the column-parallel head uses, so their gradient is reduced over
    tensor-parallel ranks as the unfused head's is (all-reduce, or reduce-scatter under sequence parallelism)."""
    from megatron.core import parallel_state as ps

    group = ps.get_tensor_model_parallel_group()
    if sequence_parallel:
        hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=True)
    b, s = input_ids.shape
    # tokens in the decoder's [s, b] order: a view, so the gradient reaches the decoder contiguous (Megatron's
    # all-reduce of a non-contiguous gradient does nothing, and its frozen linears broadcast their weight for one)
    rows = hidden.reshape(s * b, -1)
    if not sequence_parallel:
        rows = copy_to_tensor_model_parallel_region(rows)
    rows = rows.to(weight.dtype)
    targets = torch.nn.functional.pad(input_ids[:, 1:], (0, 1)).t().reshape(-1).to(rows.device)  # last: predicts nothing
    # position p's row predicts token p + 1: it is needed when that token is scored
    needed = None if scored is None else torch.nn.functional.pad(scored[:, 1:], (0, 1)).t().reshape(-1).nonzero()
    if needed is None or needed.numel() == 0:  # (nothing scored: every row, so that the loss keeps its graph)
        logprobs, entropy = _ChunkedHeadLogprobs.apply(rows, weight, targets, temperature, group, with_entropy,
                                                      chunk_bytes)
    else:
        needed = needed.squeeze(1)
        some = _ChunkedHeadLogprobs.apply(rows[needed], weight, targets[needed], temperature, group, with_entropy,
                                          chunk_bytes)
        logprobs, entropy = (torch.zeros(s * b, dtype=v.dtype, device=v.device).index_copy(0, needed, v)
                             for v in some)
    shift = lambda v: torch.nn.functional.pad(v.view(s, b).t()[:, :-1], (1, 0))  # noqa: E731
    return shift(logprobs), shift(entropy) if with_entropy else None


def pair_scores(rows: Tensor, weight: Tensor, targets: Tensor, temperature: float, with_entropy: bool,
                chunk_bytes: int) -> tuple[Tensor, Optional[Tensor]]:
    """rows [n, h] (final-norm outputs, each the position that predicts one token; not split over TP ranks), this
    rank's head weight [V/tp, h], targets [n] -> logprobs [n] of the targets (differentiable w.r.t. ``rows`` and
    ``weight``) and, with ``with_entropy``, the entropy [n] of each distribution (no gradient): the fused head of
    :func:`head_scores` on given (position, token) pairs instead of each position and its successor."""
    from megatron.core import parallel_state as ps

    rows = copy_to_tensor_model_parallel_region(rows).to(weight.dtype)
    logprobs, entropy = _ChunkedHeadLogprobs.apply(rows, weight, targets.to(rows.device), temperature,
                                                  ps.get_tensor_model_parallel_group(), with_entropy, chunk_bytes)
    return logprobs, entropy if with_entropy else None


def _chunk_logits(rows: Tensor, weight: Tensor, temperature: float) -> Tensor:
    """rows [n, h] x weight [V/tp, h] -> fp32 logits [n, V/tp] of the sampling distribution."""
    z = (rows @ weight.t()).float()
    return z / temperature if temperature != 1.0 else z


def _products_in_fp32(a: Tensor, b: Tensor) -> Tensor:
    """a [n, k] @ b [k, m] -> fp32 [n, m]: a bf16 matmul's products summed in fp32 and not rounded back, as
    the unfused matmul does over the whole vocabulary. On CUDA the bf16 tensor cores write fp32 (``out_dtype``;
    an fp32 matmul there would run without them); torch has no such kernel on the CPU, which multiplies the
    operands upcast."""
    if a.is_cuda and a.dtype in (torch.bfloat16, torch.float16):
        return torch.mm(a, b, out_dtype=torch.float32)
    return a.float() @ b.float()


class _ChunkedHeadLogprobs(torch.autograd.Function):
    """rows [N, h], weight [V/tp, h], targets [N] -> logprobs [N] and entropy [N] (zeros unless asked)."""

    @staticmethod
    def forward(ctx, rows, weight, targets, temperature, group, with_entropy, chunk_bytes):
        n, vocab = rows.shape[0], weight.shape[0]
        start = dist.get_rank(group) * vocab  # (this rank's vocabulary slice; at TP=1 the group is of one)
        local = targets - start
        mine = (local >= 0) & (local < vocab)
        local = torch.where(mine, local, 0)
        step = max(1, chunk_bytes // (4 * vocab))
        logprobs, lse, entropy = (torch.zeros(n, device=rows.device) for _ in range(3))
        for i in range(0, n, step):
            z = _chunk_logits(rows[i:i + step], weight, temperature)
            z_max = z.max(dim=-1).values
            dist.all_reduce(z_max, op=dist.ReduceOp.MAX, group=group)
            target = torch.where(mine[i:i + step], z.gather(1, local[i:i + step, None]).squeeze(1), 0.0)
            e = torch.sub(z, z_max.unsqueeze(-1)).exp_()  # (in place: one chunk-sized working tensor beside z)
            stats = [e.sum(dim=-1), target] + ([e.mul_(z).sum(dim=-1)] if with_entropy else [])
            del e, z
            stats = torch.stack(stats)
            dist.all_reduce(stats, group=group)
            lse[i:i + step] = z_max + torch.log(stats[0])
            logprobs[i:i + step] = stats[1] - lse[i:i + step]
            if with_entropy:
                entropy[i:i + step] = lse[i:i + step] - stats[2] / stats[0]
        ctx.save_for_backward(rows, weight, local, mine, lse)
        ctx.temperature, ctx.chunk_bytes = temperature, chunk_bytes
        ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, _grad_entropy):
        """In slices of the vocabulary, every token at once: each slice of the weight's gradient is then one matmul
        over all tokens, as in the unfused head (no accumulator of the whole [V/tp, h] beside it), and the rows'
        gradient [N, h] is summed over slices in fp32."""
        rows, weight, local, mine, lse = ctx.saved_tensors
        want_rows, want_weight = ctx.needs_input_grad[:2]
        n, vocab = rows.shape[0], weight.shape[0]
        g = grad_logprobs.float()
        grad_rows = torch.zeros(rows.shape, dtype=torch.float32, device=rows.device) if want_rows else None
        grad_weight = torch.empty_like(weight) if want_weight else None
        step = max(1, ctx.chunk_bytes // (4 * n))
        for v in range(0, vocab, step):
            w = weight[v:v + step]
            # d logprob / d z = onehot(target) - softmax, times the incoming gradient, over the temperature
            grad_z = _chunk_logits(rows, w, ctx.temperature).sub_(lse.unsqueeze(-1)).exp_()  # (in place)
            grad_z.mul_(-g.unsqueeze(-1))
            hit = (mine & (local >= v) & (local < v + step)).nonzero().squeeze(1)
            grad_z.index_put_((hit, local[hit] - v), g[hit], accumulate=True)
            if ctx.temperature != 1.0:
                grad_z.div_(ctx.temperature)
            grad_z = grad_z.to(weight.dtype)
            if want_rows:
                grad_rows.add_(_products_in_fp32(grad_z, w))
            if want_weight:
                grad_weight[v:v + step] = grad_z.t() @ rows
        return None if grad_rows is None else grad_rows.to(rows.dtype), grad_weight, None, None, None, None, None
