"""Packed sequences in a transformers model: an attention function registered in transformers' registry.

Why a registered function and not transformers' own support: transformers keeps packed rows apart by
position_ids that restart per row, but its SDPA path does so with a block-diagonal [L, L] mask (more attention
work than the padding packing saves), and its varlen path needs the flash-attn package (CUDA only). The
function here runs transformers' own ``sdpa_attention_forward`` on each row's segment of the packed sequence
(given as ``cu_seq_lens_q``, the keyword transformers' flash-attention path uses), causal by flag, the segments
of about one length together as rows of a batch (:func:`rlkit.policy.packing.segment_groups`): about sum(l_i^2)
work and the same kernel as an unpacked batch. RoPE needs nothing: the model rotates by ``position_ids``, which
the caller passes restarting at 0 for each row (:class:`rlkit.policy.packing.PackedRows`).

The model gets it with ``attn_implementation=PACKED_SDPA`` after :func:`register`; every forward pass must
then pass ``cu_seq_lens_q`` (an unpacked batch is one segment per row, not supported: the policy packs every
pass when packing is on).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from rlkit.policy.packing import segment_groups

PACKED_SDPA = "rlkit_packed_sdpa"


def packed_sdpa_attention(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor,
                          attention_mask: Optional[Tensor], cu_seq_lens_q: Optional[Tensor] = None,
                          **kwargs) -> tuple[Tensor, None]:
    """Causal attention within each segment. query [1, heads, L, d], key/value [1, kv_heads, L, d],
    ``cu_seq_lens_q`` [segments + 1] -> (context [1, L, heads, d], no weights)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if cu_seq_lens_q is None:
        raise ValueError(f"attn_implementation={PACKED_SDPA!r} needs cu_seq_lens_q (the segment bounds of a packed "
                         "sequence) in every forward call; pack the rows with rlkit.policy.packing.pack_rows")
    if attention_mask is not None or query.shape[0] != 1:
        raise ValueError(f"{PACKED_SDPA!r} takes one packed sequence (batch 1) and no attention mask, got batch "
                         f"{query.shape[0]} and {'a' if attention_mask is not None else 'no'} mask")
    for key_ in ("cu_seq_lens_k", "is_causal"):
        kwargs.pop(key_, None)
    bounds = cu_seq_lens_q.tolist()
    if bounds[-1] != query.shape[2]:
        raise ValueError(f"cu_seq_lens_q ends at {bounds[-1]}, but the packed sequence holds {query.shape[2]} "
                         "positions")
    context = query.new_empty(1, query.shape[2], query.shape[1], query.shape[3])
    for positions, real in segment_groups(cu_seq_lens_q):  # [n, r]: segments of about one length
        index, real = positions.to(query.device), real.to(query.device)
        q, k, v = (t[0][:, index].transpose(0, 1) for t in (query, key, value))  # [n, heads, r, d]
        out = sdpa_attention_forward(module, q, k, v, None, is_causal=True, **kwargs)[0]  # [n, r, heads, d]
        context[0, index[real]] = out[real]
    return context, None


def register() -> str:
    """Register the function (and its mask builder) with transformers; returns its ``attn_implementation`` name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(PACKED_SDPA, packed_sdpa_attention)
    AttentionMaskInterface.register(PACKED_SDPA, lambda **_: None)  # no mask: segments come from cu_seq_lens_q
    return PACKED_SDPA
