"""HF <-> Megatron-Core weight conversion for Llama / Qwen2 / Qwen3 / Mistral / Phi-3 / OLMo 2 / Gemma 3 decoders, with tensor-parallel
sharding (Phi-3's fused ``qkv_proj`` and ``gate_up_proj`` are re-spelled around this mapping: :mod:`.hf_layouts`).

Layouts (exact to ~1e-7 in fp32 against transformers; ``g`` = KV group, ``q_g`` = the query heads of group g):

=============================================  ================================================================
Megatron (local spec)                          HF
=============================================  ================================================================
embedding.word_embeddings.weight   [V, H]      model.embed_tokens.weight
decoder.layers.i.input_layernorm.weight        model.layers.i.input_layernorm.weight
decoder.layers.i.self_attention.linear_qkv     q/k/v_proj fused per KV group: [q_g; k_g; v_g] for g = 0..G-1
decoder.layers.i.self_attention.linear_proj    model.layers.i.self_attn.o_proj.weight
...self_attention.q_layernorm / k_layernorm    self_attn.q_norm / k_norm  [head_dim] (Qwen3), [heads*head_dim] (OLMo 2)
decoder.layers.i.pre_mlp_layernorm.weight      model.layers.i.post_attention_layernorm.weight
decoder.layers.i.mlp.linear_fc1.weight         [gate_proj; up_proj]
decoder.layers.i.mlp.linear_fc2.weight         model.layers.i.mlp.down_proj.weight
decoder.final_layernorm.weight                 model.norm.weight
output_layer.weight                            lm_head.weight (absent when embeddings are tied)
=============================================  ================================================================

OLMo 2's norms sit after attention and the MLP instead, Gemma 3's before and after both (see :func:`_norm_names`,
:mod:`.post_norm` and :mod:`.gemma`).

Tensor parallelism: vocabulary, QKV (whole KV groups) and fc1 shard along dim 0, linear_proj and fc2
along dim 1, norms are replicated. fc1 is special: each rank holds ``[gate shard; up shard]``, so gate and
up are split separately, not the fused tensor. Conversion works on full tensors; :func:`shard` and
:func:`unshard` move between full tensors and one rank's piece, so no code here assumes TP=1.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, Mapping, Optional

import torch
from torch import Tensor

from rlkit.policy.architecture import Architecture
from rlkit.policy.megatron.hf_layouts import UnfusedView, fused_groups
from rlkit.weights import HFGroup


# ---- full-tensor layout ----------------------------------------------------------------------------
def interleave(parts: list[Tensor], groups: int, dim: int) -> Tensor:
    """Projections' tensors -> the fused layout along ``dim``: each split into ``groups`` equal blocks, block g of
    every part side by side (the QKV's KV groups: ``[q_g, k_g, v_g]`` per group; ``groups=1``: concatenation)."""
    dim = dim % parts[0].dim()
    blocks = [p.unflatten(dim, (groups, -1)) for p in parts]
    return torch.cat(blocks, dim=dim + 1).flatten(dim, dim + 1)


def fuse_qkv(q: Tensor, k: Tensor, v: Tensor, arch: Architecture) -> Tensor:
    """[nh*d, ...], [ng*d, ...], [ng*d, ...] -> [ng*(nh/ng + 2)*d, ...] interleaved per KV group."""
    return interleave([q, k, v], arch.num_key_value_heads, dim=0)


def split_qkv(qkv: Tensor, arch: Architecture) -> tuple[Tensor, Tensor, Tensor]:
    """Inverse of :func:`fuse_qkv`."""
    ng, d = arch.num_key_value_heads, arch.head_dim
    q_per_group = arch.num_attention_heads // ng * d
    rest = qkv.shape[1:]
    grouped = qkv.reshape(ng, q_per_group + 2 * d, *rest)
    q, k, v = torch.split(grouped, [q_per_group, d, d], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def attention_to_megatron(hf: Mapping[str, Tensor], i: int, arch: Architecture) -> dict[str, Tensor]:
    """Full Megatron tensors of decoder layer ``i``'s norms and attention (everything but the MLP)."""
    h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
    if arch.kv_lora_rank:  # DeepSeek-V3's latent attention
        from rlkit.policy.megatron import mla

        return {**mla.attention_to_megatron(hf, i, arch), **{m + mc: hf[h + x] for x, mc in _norm_names(arch)}}
    out = {
        m + "self_attention.linear_qkv.weight": fuse_qkv(*(hf[h + f"self_attn.{x}_proj.weight"] for x in "qkv"), arch),
        m + "self_attention.linear_proj.weight": hf[h + "self_attn.o_proj.weight"],
    }
    for hf_norm, mc_norm in _norm_names(arch):
        out[m + mc_norm] = hf[h + hf_norm]
    if arch.qkv_bias:
        out[m + "self_attention.linear_qkv.bias"] = fuse_qkv(*(hf[h + f"self_attn.{x}_proj.bias"] for x in "qkv"), arch)
    for x in "qk" if arch.qk_layernorm else "":
        out[m + f"self_attention.{x}_layernorm.weight"] = hf[h + f"self_attn.{x}_norm.weight"]
    return out


def attention_to_hf(mc: Mapping[str, Tensor], i: int, arch: Architecture) -> HFGroup:
    """HF tensors of decoder layer ``i``'s norms and attention (inverse of :func:`attention_to_megatron`)."""
    h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
    if arch.kv_lora_rank:
        from rlkit.policy.megatron import mla

        return mla.attention_to_hf(mc, i, arch) + [(h + x, mc[m + y]) for x, y in _norm_names(arch)]
    qkv = split_qkv(mc[m + "self_attention.linear_qkv.weight"], arch)
    out = [
        *((h + f"self_attn.{x}_proj.weight", t) for x, t in zip("qkv", qkv)),
        (h + "self_attn.o_proj.weight", mc[m + "self_attention.linear_proj.weight"]),
    ]
    out += [(h + hf_norm, mc[m + mc_norm]) for hf_norm, mc_norm in _norm_names(arch)]
    if arch.qkv_bias:
        qkv_bias = split_qkv(mc[m + "self_attention.linear_qkv.bias"], arch)
        out += [(h + f"self_attn.{x}_proj.bias", t) for x, t in zip("qkv", qkv_bias)]
    for x in "qk" if arch.qk_layernorm else "":
        out.append((h + f"self_attn.{x}_norm.weight", mc[m + f"self_attention.{x}_layernorm.weight"]))
    return out


def _norm_names(arch: Architecture) -> list[tuple[str, str]]:
    """A layer's block norms outside attention and MLP as (HF, Megatron) names: the pre-norms of Llama's block, or
    OLMo 2's norms after attention and after the MLP, which :mod:`.post_norm` carries on the branches' last linears, or
    Gemma 3's four: its pre-norms in Llama's slots, its post-norms where OLMo 2's are."""
    if arch.gemma:
        return [("input_layernorm.weight", "input_layernorm.weight"),
                ("post_attention_layernorm.weight", "self_attention.linear_proj.post_norm.weight"),
                ("pre_feedforward_layernorm.weight", "pre_mlp_layernorm.weight"),
                ("post_feedforward_layernorm.weight", "mlp.linear_fc2.post_norm.weight")]
    if arch.post_norms:
        return [("post_attention_layernorm.weight", "self_attention.linear_proj.post_norm.weight"),
                ("post_feedforward_layernorm.weight", "mlp.linear_fc2.post_norm.weight")]
    return [("input_layernorm.weight", "input_layernorm.weight"),
            ("post_attention_layernorm.weight", "pre_mlp_layernorm.weight")]


def attention_param_names(i: int, arch: Architecture) -> list[str]:
    m = f"decoder.layers.{i}."
    if arch.kv_lora_rank:
        from rlkit.policy.megatron import mla

        return mla.attention_param_names(i, arch) + [m + y for _, y in _norm_names(arch)]
    names = [m + s for s in ("self_attention.linear_qkv.weight", "self_attention.linear_proj.weight")]
    names += [m + mc_norm for _, mc_norm in _norm_names(arch)]
    if arch.qkv_bias:
        names.append(m + "self_attention.linear_qkv.bias")
    if arch.qk_layernorm:
        names += [m + "self_attention.q_layernorm.weight", m + "self_attention.k_layernorm.weight"]
    return names


def gated_mlp_to_megatron(hf: Mapping[str, Tensor], x: str, names: tuple[str, str, str], y: str) -> dict[str, Tensor]:
    """HF SwiGLU weights under prefix ``x`` (gate, up, down ``names``) -> Megatron's fused fc1 and fc2 under ``y``."""
    gate, up, down = names
    return {y + "linear_fc1.weight": torch.cat([hf[f"{x}{gate}.weight"], hf[f"{x}{up}.weight"]]),
            y + "linear_fc2.weight": hf[f"{x}{down}.weight"]}


def gated_mlp_to_hf(mc: Mapping[str, Tensor], y: str, x: str, names: tuple[str, str, str]) -> HFGroup:
    """Inverse of :func:`gated_mlp_to_megatron`."""
    gate, up, down = names
    w_gate, w_up = torch.chunk(mc[y + "linear_fc1.weight"], 2, dim=0)
    return [(f"{x}{gate}.weight", w_gate), (f"{x}{up}.weight", w_up), (f"{x}{down}.weight", mc[y + "linear_fc2.weight"])]


MLP_NAMES = ("gate_proj", "up_proj", "down_proj")  # HF names of a Llama/Qwen SwiGLU MLP's projections


def hf_layer_to_megatron(hf: Mapping[str, Tensor], i: int, arch: Architecture) -> dict[str, Tensor]:
    """Full Megatron tensors of dense decoder layer ``i`` from HF tensors."""
    out = attention_to_megatron(hf, i, arch)
    out.update(gated_mlp_to_megatron(hf, f"model.layers.{i}.mlp.", MLP_NAMES, f"decoder.layers.{i}.mlp."))
    return out


def megatron_layer_to_hf(mc: Mapping[str, Tensor], i: int, arch: Architecture) -> HFGroup:
    """HF tensors of dense decoder layer ``i`` from full Megatron tensors (inverse of :func:`hf_layer_to_megatron`)."""
    return attention_to_hf(mc, i, arch) + gated_mlp_to_hf(mc, f"decoder.layers.{i}.mlp.", f"model.layers.{i}.mlp.",
                                                          MLP_NAMES)


def layer_param_names(i: int, arch: Architecture) -> list[str]:
    m = f"decoder.layers.{i}."
    return attention_param_names(i, arch) + [m + "mlp.linear_fc1.weight", m + "mlp.linear_fc2.weight"]


def hf_to_megatron_groups(hf: Mapping[str, Tensor], arch: Architecture, layer_to_megatron: Optional[Callable] = None,
                          layers: Optional[Iterable[int]] = None, ends: bool = True) -> Iterator[dict[str, Tensor]]:
    """Full Megatron tensors from HF tensors, one group at a time (embedding, each decoder layer, final norm and
    head), so a loader holds one layer's conversion at once. ``layer_to_megatron`` maps one decoder layer
    (default: the dense :func:`hf_layer_to_megatron`; the MoE module passes its own); ``layers`` limits the
    decoder layers converted (a pipeline stage's); ``ends=False`` leaves out the embedding and the final group."""
    layer_to_megatron = layer_to_megatron or hf_layer_to_megatron
    if arch.fused_projections:  # Phi-3's checkpoint, seen under the Llama layout's names
        hf = UnfusedView(hf, arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim)
    if ends:
        yield {"embedding.word_embeddings.weight": hf["model.embed_tokens.weight"]}
    for i in range(arch.num_layers) if layers is None else layers:
        yield layer_to_megatron(hf, i, arch)
    if ends:
        last = {"decoder.final_layernorm.weight": hf["model.norm.weight"]}
        if not arch.tie_word_embeddings:
            last["output_layer.weight"] = hf["lm_head.weight"]
        yield last


def megatron_to_hf_groups(full: Callable[[str], Tensor], arch: Architecture, layer_names: Optional[Callable] = None,
                          layer_to_hf: Optional[Callable] = None) -> Iterator[HFGroup]:
    """HF tensors in groups that keep fused tensors whole: embeddings, each layer, final norm + head.

    ``full(name)`` returns the full (unsharded) Megatron tensor ``name``; it is called lazily, one group
    at a time, so a sharded policy gathers only one layer beyond the model at once. ``layer_names`` and
    ``layer_to_hf`` map one decoder layer (default: dense; the MoE module passes its own).
    """
    layer_names, layer_to_hf = layer_names or layer_param_names, layer_to_hf or megatron_layer_to_hf
    yield [("model.embed_tokens.weight", full("embedding.word_embeddings.weight"))]
    layers = (layer_to_hf({n: full(n) for n in layer_names(i, arch)}, i, arch) for i in range(arch.num_layers))
    yield from fused_groups(layers) if arch.fused_projections else layers
    last = [("model.norm.weight", full("decoder.final_layernorm.weight"))]
    if not arch.tie_word_embeddings:
        last.append(("lm_head.weight", full("output_layer.weight")))
    yield last


# ---- tensor-parallel sharding ----------------------------------------------------------------------
def shard_dim(name: str) -> int | None:
    """The dimension ``name`` is split along under tensor parallelism (None: replicated)."""
    if name.endswith(("word_embeddings.weight", "output_layer.weight", "linear_qkv.weight", "linear_qkv.bias",
                      "linear_fc1.weight")):
        return 0
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return 1
    return None


def shard(name: str, full: Tensor, rank: int, size: int) -> Tensor:
    """Rank ``rank``'s piece of the full tensor ``name`` (of ``size`` ranks)."""
    dim = shard_dim(name)
    if dim is None or size == 1:
        return full
    if name.endswith("linear_fc1.weight"):
        gate, up = torch.chunk(full, 2, dim=0)
        return torch.cat([torch.chunk(gate, size)[rank], torch.chunk(up, size)[rank]])
    return torch.chunk(full, size, dim=dim)[rank]


def unshard(name: str, pieces: list[Tensor]) -> Tensor:
    """The full tensor ``name`` from every rank's piece, in rank order (inverse of :func:`shard`)."""
    dim = shard_dim(name)
    if dim is None or len(pieces) == 1:
        return pieces[0]
    if name.endswith("linear_fc1.weight"):
        halves = [torch.chunk(p, 2, dim=0) for p in pieces]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    return torch.cat(pieces, dim=dim)
