"""Megatron's local core attention computed by torch's ``scaled_dot_product_attention``.

Why: the local layer spec's ``DotProductAttention`` materialises the scores [b, heads, s, s] (and, for causal
attention, builds a [s, s] mask every call) before a separate softmax: memory and time quadratic in the
sequence. Transformer Engine's fused attention avoids that but is not installed everywhere (not on the CPU,
not on the GPU machine this project can borrow). torch's SDPA picks a fused kernel itself (FlashAttention or
memory-efficient on CUDA, a flash kernel on the CPU) and takes causality as a flag, so the mask type is all
it needs. Same numerics as Megatron's unfused path within float rounding (tests/policy/test_precision*.py and
the conversion tests compare against transformers' forward).

Where it is used (:func:`core_attention`): on CUDA. On the CPU Megatron's own unfused attention stays the
default: the two agree within float rounding (5.4e-7), but a seeded RL run is chaotic, and that rounding moved
the suite's calibrated checks (tests/session/test_learning.py's reward gain at its seed fell from +0.20 to
+0.06 against a +0.08 bound; over six seeds the gains spread from -0.04 to +0.20 with either kernel; the MoE
TP=2+SP weights after one Adam step moved from within 1e-5 to 1.6e-5 of one process's), while at the short
sequences CPU runs use it saves nothing (0.96x the CPU-seconds at 256 tokens; 0.67x at 1024).

Deliberate simplifications: no packed sequences, no attention bias, the plain ("vanilla") softmax only.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch
from megatron.core import tensor_parallel
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from torch import Tensor


class SDPAttention(DotProductAttention):
    """``DotProductAttention``'s interface and settings (heads per tensor-parallel rank, softmax scale,
    dropout) with SDPA's kernels. Query [sq, b, np, hn], key/value [sk, b, ng, hn] (GQA groups are not
    repeated: SDPA broadcasts them) -> context [sq, b, np * hn]."""

    def forward(self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
                attn_mask_type: Optional[AttnMaskType] = None, attention_bias: Optional[Tensor] = None,
                packed_seq_params=None) -> Tensor:
        if packed_seq_params is not None or attention_bias is not None:
            raise NotImplementedError("SDPAttention takes neither packed sequences nor an attention bias")
        if self.softmax_offset is not None:
            raise NotImplementedError(f"SDPAttention computes the vanilla softmax, not {self.config.softmax_type!r}")
        causal = (attn_mask_type or self.attn_mask_type) == AttnMaskType.causal and attention_mask is None
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, hn]
        dropout = self.attention_dropout.p if self.training else 0.0
        rng = tensor_parallel.get_cuda_rng_tracker().fork() if dropout and not self.config.sequence_parallel else None
        with rng or contextlib.nullcontext():
            context = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=None if attention_mask is None else ~attention_mask,  # Megatron: True = masked
                dropout_p=dropout, is_causal=causal, scale=self.softmax_scale,
                enable_gqa=q.shape[1] != k.shape[1])
        sq, b = query.shape[0], query.shape[1]
        return context.permute(2, 0, 1, 3).reshape(sq, b, self.hidden_size_per_partition)


def core_attention() -> type:
    """The core attention module of the layer spec: :class:`SDPAttention` on CUDA, Megatron's
    ``DotProductAttention`` on the CPU (see the module docstring)."""
    if torch.cuda.is_available():
        return SDPAttention
    return DotProductAttention
