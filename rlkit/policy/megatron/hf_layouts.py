"""HF checkpoints whose projections are stored fused (Phi-3, Phi-4-mini), seen as the Llama layout and written back.

Why a view, not a second converter: Phi-3 differs from Llama only in how its checkpoint stores two projections,
so :mod:`.convert` stays the one mapping and this module only re-spells names around it.

=============================================  ================================================================
HF, fused (Phi-3)                              HF, Llama layout (what :mod:`.convert` reads and writes)
=============================================  ================================================================
self_attn.qkv_proj.weight  [(nh+2ng)*d, H]     self_attn.q_proj [nh*d, H]; k_proj [ng*d, H]; v_proj [ng*d, H]
                                               (all query heads, then all key heads, then all value heads)
mlp.gate_up_proj.weight  [2*F, H]              mlp.gate_proj [F, H]; mlp.up_proj [F, H]
=============================================  ================================================================

Reading splits lazily (a slice of the stored tensor, so a meta or memory-mapped mapping stays one); writing
fuses within one group, which always holds a whole decoder layer (:func:`.convert.megatron_to_hf_groups`).
"""

from __future__ import annotations

import re
from typing import Iterator, Mapping

import torch
from torch import Tensor

from rlkit.weights import HFGroup

_SPLIT = re.compile(r"^(.*\.)(self_attn\.(q|k|v)_proj|mlp\.(gate|up)_proj)\.weight$")


class UnfusedView(Mapping[str, Tensor]):
    """A fused HF checkpoint (``hf``) under the Llama layout's names; every other name passes through."""

    def __init__(self, hf: Mapping[str, Tensor], num_attention_heads: int, num_key_value_heads: int, head_dim: int):
        self._hf = hf
        q, kv = num_attention_heads * head_dim, num_key_value_heads * head_dim
        self._rows = {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv)}

    def __getitem__(self, name: str) -> Tensor:
        m = _SPLIT.match(name)
        if m is None:
            return self._hf[name]
        prefix, qkv, gate_up = m.group(1), m.group(3), m.group(4)
        if qkv:
            start, end = self._rows[qkv]
            return self._hf[prefix + "self_attn.qkv_proj.weight"][start:end]
        return torch.chunk(self._hf[prefix + "mlp.gate_up_proj.weight"], 2, dim=0)[gate_up == "up"]

    def __iter__(self):  # the names a Llama-layout checkpoint would hold
        for name in self._hf:
            if name.endswith("self_attn.qkv_proj.weight"):
                yield from (name.replace("qkv_proj", f"{x}_proj") for x in "qkv")
            elif name.endswith("mlp.gate_up_proj.weight"):
                yield from (name.replace("gate_up_proj", x) for x in ("gate_proj", "up_proj"))
            else:
                yield name

    def __len__(self) -> int:
        return sum(1 for _ in self)


def fused_groups(groups: Iterator[HFGroup]) -> Iterator[HFGroup]:
    """Llama-layout HF groups -> the fused checkpoint's names (inverse of :class:`UnfusedView`)."""
    for group in groups:
        tensors = dict(group)
        out = []
        for name, tensor in group:
            m = _SPLIT.match(name)
            if m is None:
                out.append((name, tensor))
            elif m.group(3) == "q":
                parts = [tensors[name.replace("q_proj", f"{x}_proj")] for x in "qkv"]
                out.append((name.replace("q_proj", "qkv_proj"), torch.cat(parts)))
            elif m.group(4) == "gate":
                up = tensors[name.replace("gate_proj", "up_proj")]
                out.append((name.replace("gate_proj", "gate_up_proj"), torch.cat([tensor, up])))
        yield out
