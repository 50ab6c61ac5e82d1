"""Megatron's local core attention computed by torch's ``scaled_dot_product_attention``.

Why: the local layer spec's ``DotProductAttention`` materialises the scores [b, heads, s, s] (and, for causal
attention, builds a [s, s] mask every call) before a separate softmax: memory and time quadratic in the
sequence. Transformer Engine's fused attention avoids that but is not installed everywhere (not on the CPU,
not on the GPU machine this project can borrow). torch's SDPA picks a fused kernel itself (FlashAttention or
memory-efficient on CUDA, a flash kernel on the CPU) and takes causality as a flag, so the mask type is all
it needs. Same numerics as Megatron's unfused path within float rounding (tests/policy/test_precision*.py and
the conversion tests compare against transformers' forward).

Where it is used (:func:`core_attention`): on CUDA. On the CPU Megatron's own unfused attention stays the
default: the two agree within float rounding, but a seeded RL run is chaotic and that rounding moves the
suite's calibrated checks, while at the short sequences CPU runs use it saves nothing (figures:
docs/measurements.md, "Figures that docstrings used to carry").

Packed sequences (``policy.sequence_packing``: several rows in one sequence, Megatron's ``PackedSeqParams`` in
the "thd" format, query [L, heads, hn]): both core attentions here run causal attention within each segment of
``cu_seqlens``, the segments of about one length together as the rows of a batch, through the same kernel as
unpacked rows (:func:`attend_per_segment`). That costs about sum(l_i^2) where a block-diagonal [L, L] mask would
cost L^2. Megatron's own ``DotProductAttention`` refuses
packed sequences (it leaves them to Transformer Engine), so on the CPU :class:`PackedDotProductAttention` adds
the segment loop around it and leaves its unpacked path as it is. RoPE restarts per segment in Megatron itself
(``apply_rotary_pos_emb`` with ``cu_seqlens``).

Sliding windows (Gemma 3's local layers, Megatron's ``window_size``): Megatron's unfused attention builds the window's
mask itself (on the CPU through :mod:`.cpu`'s stand-in); :class:`SDPAttention` passes the same mask to SDPA. As in
Megatron's own, the window's mask replaces any mask given.

Deliberate simplifications: no attention bias, the plain ("vanilla") softmax only, packed self-attention only
(query and key segments the same).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Optional

import torch
from megatron.core import tensor_parallel
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from torch import Tensor

from rlkit.policy.packing import segment_groups


def attend_per_segment(attend: Callable[[Tensor, Tensor, Tensor], Tensor], query: Tensor, key: Tensor, value: Tensor,
                       packed: PackedSeqParams) -> Tensor:
    """Causal self-attention within each segment of a packed sequence. Query [L, np, hn], key/value [L, ng, hn]
    (the "thd" format: Megatron squeezes the batch dimension of one) -> context [L, 1, np * hn]. ``attend`` runs
    the segments of about one length together in the unpacked layout, as rows of a batch
    (:func:`rlkit.policy.packing.segment_groups`): [r, n, np, hn], [r, n, ng, hn] x 2 -> [r, n, np * hn]."""
    if packed.qkv_format != "thd":
        raise NotImplementedError(f"packed sequences in the 'thd' format only, not {packed.qkv_format!r}")
    cu_q = packed.cu_seqlens_q_padded if packed.cu_seqlens_q_padded is not None else packed.cu_seqlens_q
    cu_kv = packed.cu_seqlens_kv_padded if packed.cu_seqlens_kv_padded is not None else packed.cu_seqlens_kv
    if cu_kv is not None and not torch.equal(cu_q, cu_kv):
        raise NotImplementedError("packed self-attention only: cu_seqlens_q and cu_seqlens_kv must be equal")
    bounds = cu_q.tolist()
    if bounds[-1] != query.shape[0]:
        raise ValueError(f"cu_seqlens end at {bounds[-1]}, but the packed sequence holds {query.shape[0]} positions")
    context = query.new_empty(query.shape[0], 1, query.shape[1] * query.shape[2])
    for positions, real in segment_groups(cu_q):  # [n, r] each: segments of about one length together
        index, real = positions.to(query.device), real.to(query.device)
        q, k, v = (t[index].transpose(0, 1) for t in (query, key, value))  # [r, n, heads, hn]
        out = attend(q, k, v).transpose(0, 1)  # [n, r, np * hn]
        context[index[real]] = out[real].unsqueeze(1)
    return context


def _refuse_unsupported(attention_mask: Optional[Tensor], attn_mask_type: Optional[AttnMaskType], module) -> None:
    mask_type = attn_mask_type or module.attn_mask_type
    if attention_mask is not None or mask_type != AttnMaskType.causal:
        raise NotImplementedError(f"packed sequences take causal attention without a mask tensor, not {mask_type} "
                                  f"with {'a' if attention_mask is not None else 'no'} mask")


class PackedDotProductAttention(DotProductAttention):
    """Megatron's unfused ``DotProductAttention``, unchanged for unpacked input, and for packed sequences the
    same attention run on each segment (:func:`attend_per_segment`)."""

    def forward(self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
                attn_mask_type: Optional[AttnMaskType] = None, attention_bias: Optional[Tensor] = None,
                packed_seq_params: Optional[PackedSeqParams] = None) -> Tensor:
        if packed_seq_params is None:
            return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias)
        _refuse_unsupported(attention_mask, attn_mask_type, self)
        unpacked = super().forward
        return attend_per_segment(lambda q, k, v: unpacked(q, k, v, None, AttnMaskType.causal, attention_bias),
                                  query, key, value, packed_seq_params)


class SDPAttention(DotProductAttention):
    """``DotProductAttention``'s interface and settings (heads per tensor-parallel rank, softmax scale,
    dropout) with SDPA's kernels. Query [sq, b, np, hn], key/value [sk, b, ng, hn] (GQA groups are not
    repeated: SDPA broadcasts them) -> context [sq, b, np * hn]."""

    def forward(self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
                attn_mask_type: Optional[AttnMaskType] = None, attention_bias: Optional[Tensor] = None,
                packed_seq_params: Optional[PackedSeqParams] = None) -> Tensor:
        if attention_bias is not None:
            raise NotImplementedError("SDPAttention takes no attention bias")
        if packed_seq_params is not None:
            _refuse_unsupported(attention_mask, attn_mask_type, self)
            return attend_per_segment(lambda q, k, v: self.forward(q, k, v, None, AttnMaskType.causal),
                                      query, key, value, packed_seq_params)
        if self.softmax_offset is not None:
            raise NotImplementedError(f"SDPAttention computes the vanilla softmax, not {self.config.softmax_type!r}")
        causal = (attn_mask_type or self.attn_mask_type) == AttnMaskType.causal and attention_mask is None
        window = self.scale_mask_softmax.window_size  # a local layer's (Gemma 3): replaces the mask, as Megatron's does
        if window is not None:  # the helper Megatron's softmax calls (the CPU's stand-in where there is no CUDA)
            from megatron.core.fusions import fused_softmax

            attention_mask = fused_softmax.get_sliding_window_causal_mask(query.shape[0], key.shape[0], window)
            causal = False
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


def core_attention(sinks: bool = False) -> type:
    """The core attention module of the layer spec: :class:`SDPAttention` on CUDA, Megatron's
    ``DotProductAttention`` on the CPU (with packed sequences segment by segment; see the module docstring), and
    everywhere for attention with ``sinks`` (GPT-OSS's learnable sink logits: Megatron's ``softmax_type="learnable"``,
    which its unfused softmax computes and SDPA does not)."""
    if torch.cuda.is_available() and not sinks:
        return SDPAttention
    return PackedDotProductAttention
