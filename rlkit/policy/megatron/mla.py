"""DeepSeek-V3's multi-head latent attention (MLA) on Megatron-Core's ``MLASelfAttention``: the layer spec's pieces
that the CPU lacks, and the HF <-> Megatron weight mapping.

MLA projects the hidden state down to a query latent (``q_lora_rank``) and a key/value latent (``kv_lora_rank``)
plus one shared RoPE key (``qk_rope_head_dim``), normalises each latent, and projects them up per head to a
no-RoPE query/key part (``qk_nope_head_dim``), a RoPE query part and a value (``v_head_dim``). Megatron-Core has it
all (``MLATransformerConfig``); its RoPE on the MLA parts reads the rotated dims interleaved, as DeepSeek's
checkpoints store them (transformers' ``rope_interleave: true``), so no weight is permuted.

Two stand-ins, on machines without Transformer Engine (tested on the CPU):

1. Megatron's MLA passes ``k_channels`` and ``v_channels`` (query/key and value head sizes differ) to its core
   attention, which only Transformer Engine's takes; :func:`core_attention` is rlkit's core attention
   (:func:`rlkit.policy.megatron.attention.core_attention`) taking them, its output ``heads x v_head_dim`` wide
   (Megatron's unfused attention reads the value's head size itself).
2. megatron-core 0.16.1 sets ``multi_latent_attention.HAVE_TE`` when its TE extension module imports, which it does
   without TE (its classes are then placeholders), and its constructor then calls ``isinstance`` on a placeholder;
   :func:`apply_mla_fallbacks` sets ``HAVE_TE`` false where ``transformer_engine`` does not import.

=============================================  ================================================================
Megatron (local spec)                          HF (``model.layers.i.self_attn.``)
=============================================  ================================================================
self_attention.linear_q_down_proj  [qr, H]     q_a_proj.weight
self_attention.q_layernorm         [qr]        q_a_layernorm.weight
self_attention.linear_q_up_proj    [n*dq, qr]  q_b_proj.weight (per head [nope; rope])
self_attention.linear_q_proj       [n*dq, H]   q_proj.weight (``q_lora_rank: null``, no query latent)
self_attention.linear_kv_down_proj [kr+dr, H]  kv_a_proj_with_mqa.weight ([latent; rope key])
self_attention.kv_layernorm        [kr]        kv_a_layernorm.weight
self_attention.linear_kv_up_proj   [n*(dn+dv), kr]  kv_b_proj.weight (per head [key nope; value])
self_attention.linear_proj         [H, n*dv]   o_proj.weight
=============================================  ================================================================

Refused: tensor parallelism (by the MoE adapter). Split by rows, the down and up projections give the one-process
logprobs under TP=2 with sequence parallelism, but megatron-core 0.16.1's MLA on the local spec (column-parallel down
projections, gathered back whole) leaves the gradient of the shared RoPE key partial on each rank: after one step
``kv_a_proj_with_mqa``'s RoPE rows were 2e-3 off one process. (Transformer Engine's spec replicates the down
projections instead.) Not mapped yet: YaRN (refused by :class:`rlkit.policy.architecture.Architecture`).
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Mapping

from torch import Tensor

from rlkit.weights import HFGroup

_HF = {"linear_q_down_proj": "q_a_proj", "q_layernorm": "q_a_layernorm", "linear_q_up_proj": "q_b_proj",
       "linear_q_proj": "q_proj", "linear_kv_down_proj": "kv_a_proj_with_mqa", "kv_layernorm": "kv_a_layernorm",
       "linear_kv_up_proj": "kv_b_proj", "linear_proj": "o_proj"}


def apply_mla_fallbacks() -> None:
    """Megatron's MLA without Transformer Engine (see the module docstring, 2)."""
    from megatron.core.transformer import multi_latent_attention

    if importlib.util.find_spec("transformer_engine") is None:
        multi_latent_attention.HAVE_TE = False


@functools.cache
def core_attention() -> type:
    """rlkit's core attention taking MLA's ``k_channels`` / ``v_channels`` (see the module docstring, 1)."""
    from rlkit.policy.megatron.attention import core_attention as base

    class MLACoreAttention(base()):
        def __init__(self, *args, k_channels: int | None = None, v_channels: int | None = None, **kwargs):
            super().__init__(*args, **kwargs)
            if v_channels is not None:  # the context is heads x v_head_dim wide, not heads x kv_channels
                self.hidden_size_per_partition = self.num_attention_heads_per_partition * v_channels

    return MLACoreAttention


def attention_names(arch) -> list[str]:
    """The Megatron names of an MLA layer's attention weights (after ``decoder.layers.i.self_attention.``)."""
    queries = ["linear_q_down_proj", "q_layernorm", "linear_q_up_proj"] if arch.q_lora_rank else ["linear_q_proj"]
    return [*queries, "linear_kv_down_proj", "kv_layernorm", "linear_kv_up_proj", "linear_proj"]


def attention_to_megatron(hf: Mapping[str, Tensor], i: int, arch) -> dict[str, Tensor]:
    h, m = f"model.layers.{i}.self_attn.", f"decoder.layers.{i}.self_attention."
    return {f"{m}{name}.weight": hf[f"{h}{_HF[name]}.weight"] for name in attention_names(arch)}


def attention_to_hf(mc: Mapping[str, Tensor], i: int, arch) -> HFGroup:
    h, m = f"model.layers.{i}.self_attn.", f"decoder.layers.{i}.self_attention."
    return [(f"{h}{_HF[name]}.weight", mc[f"{m}{name}.weight"]) for name in attention_names(arch)]


def attention_param_names(i: int, arch) -> list[str]:
    return [f"decoder.layers.{i}.self_attention.{name}.weight" for name in attention_names(arch)]


def spec_with_mla(layer, norm: type):
    """The local layer spec (built with ``multi_latent_attention=True``) with rlkit's core attention and ``norm``
    for the two latents' norms."""
    import dataclasses

    attention = layer.submodules.self_attention
    attention = dataclasses.replace(attention, submodules=dataclasses.replace(
        attention.submodules, core_attention=core_attention(), q_layernorm=norm, kv_layernorm=norm))
    return dataclasses.replace(layer, submodules=dataclasses.replace(layer.submodules, self_attention=attention))
