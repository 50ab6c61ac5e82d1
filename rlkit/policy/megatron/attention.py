"""Megatron's local core attention computed by torch's ``scaled_dot_product_attention``.

Why: the local layer spec's ``DotProductAttention`` materialises the scores [b, heads, s, s] (and, for causal
attention, builds a [s, s] mask every call) before a separate softmax: memory and time quadratic in the
sequence. Transformer Engine's fused attention avoids that but is not installed everywhere (not on the CPU,
not on the GPU machine this project can borrow). torch's SDPA picks a fused kernel itself (FlashAttention or
memory-efficient on CUDA, a flash kernel on the CPU) and takes causality as a flag, so the mask type is all
it needs. Same numerics as Megatron's unfused path within float rounding (tests/policy/test_precision*.py and
the conversion tests compare against transformers' forward).

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
