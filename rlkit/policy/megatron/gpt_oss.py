"""GPT-OSS for the Megatron policy: what it adds to an MoE block, each piece a Megatron-Core option or a small stand-in.

GPT-OSS's layer is Llama's block with an MoE MLP, plus:

- biases on q/k/v/o (``add_qkv_bias``, ``add_bias_linear``), on the router's logits and on every expert's two linears
  (``add_bias_linear`` again: Megatron's router and experts take it; the expert's output bias is scaled by the routing
  weight as transformers' ``(down(x) + b) * w``);
- a learnable sink logit per head, a column in the softmax that takes probability and is dropped: Megatron's
  ``softmax_type="learnable"`` (``core_attention.softmax_offset`` [heads], ``SoftmaxOne``), computed by its unfused
  attention (so :func:`.attention.core_attention` keeps that one on CUDA too: :class:`.attention.SDPAttention` has no sink);
- ``layer_types`` alternating sliding-window and full layers: the windowed families' machinery (:mod:`.sliding_window`);
- the router: top-k of the logits, softmax over those k (Megatron's default router);
- the experts' clamped SwiGLU: ``gate.clamp(max=limit) * sigmoid(alpha * gate) * (up.clamp(-limit, limit) + 1)``,
  Megatron's unfused GLU with ``activation_func_clamp_value`` and ``glu_linear_offset=1`` around :func:`sigmoid_gate`;
- YaRN RoPE: Megatron's ``GPTModel(position_embedding_type="yarn")`` computes YaRN's angles but drops its attention
  factor for non-MLA attention, and returns a tuple that the policy's own decode and shared-prompt paths do not read.
  So the model keeps plain RoPE with YaRN's inverse frequencies put in its table (:func:`use_yarn`; same angles at
  every position, whatever the positions), and the factor ``0.1 ln(factor) + 1`` that transformers multiplies cos and
  sin by (so the logits by its square) goes into the softmax scale (:func:`softmax_scale`).

Checkpoint names: experts are stored stacked, ``mlp.experts.gate_up_proj`` [E, H, 2I] with gate and up interleaved
along the last dim (gate at even columns), ``gate_up_proj_bias`` [E, 2I] likewise, ``down_proj`` [E, I, H],
``down_proj_bias`` [E, H]; the router is ``mlp.router.weight`` [E, H] / ``.bias`` [E]; sinks ``self_attn.sinks`` [heads].

=============================================  ================================================================
Megatron (local spec, SequentialMLP experts)   HF (``model.layers.i.``)
=============================================  ================================================================
self_attention.linear_qkv.weight / .bias       self_attn.q/k/v_proj.weight / .bias (fused per KV group)
self_attention.linear_proj.weight / .bias      self_attn.o_proj.weight / .bias
self_attention.core_attention.softmax_offset   self_attn.sinks
mlp.router.weight / .bias                      mlp.router.weight / .bias
mlp.experts.local_experts.e.linear_fc1.weight  [gate_up_proj[e][:, 0::2]^T; gate_up_proj[e][:, 1::2]^T]  [2I, H]
mlp.experts.local_experts.e.linear_fc1.bias    [gate_up_proj_bias[e][0::2]; gate_up_proj_bias[e][1::2]]
mlp.experts.local_experts.e.linear_fc2.weight  down_proj[e]^T  [H, I]
mlp.experts.local_experts.e.linear_fc2.bias    down_proj_bias[e]
=============================================  ================================================================

One stand-in: megatron-core 0.16.1 adds an expert's output bias in place to the output of the local spec's row-parallel
linear, which autograd refuses in training; :class:`ExpertRowParallelLinear` hands it a copy.

Generation: vLLM on the CPU runs GPT-OSS but off transformers' fp32 logprobs by 5e-3 to 1.3e-2 (the family row's
``vllm_cpu``), so config validation switches such a run to transformers generate with one notice; the policy's own
generator (``policy.generation.backend=megatron``) computes what the policy does.

Deliberate simplifications (refused with the reason): tensor parallelism (the sinks and the biases are not mapped
to shards; expert parallelism is), LoRA (as for every MoE family), YaRN with its own ``mscale`` settings.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Mapping

import torch
from megatron.core.tensor_parallel.layers import RowParallelLinear
from torch import Tensor

from rlkit.weights import HFGroup


def sigmoid_gate(x: Tensor, alpha: float = 1.702) -> Tensor:
    """GPT-OSS's gate activation ``x * sigmoid(alpha * x)`` (Megatron's ``quick_gelu`` at alpha 1.702)."""
    return x * torch.sigmoid(alpha * x)


class ExpertRowParallelLinear(RowParallelLinear):
    """An expert's ``linear_fc2`` whose output Megatron may add its bias to in place. Why: megatron-core 0.16.1's MLP
    adds an expert's output bias, scaled by the routing weight, with ``output += ...``; on the local spec the row-parallel
    linear's output at one rank is its reduce's input returned as it is, which autograd forbids modifying in place
    ("Output 0 of _ReduceFromModelParallelRegion is a view and is being modified inplace", in every training step)."""

    def forward(self, input_, *args, **kwargs):
        output, bias = super().forward(input_, *args, **kwargs)
        return output.clone(), bias


def spec_with_expert_biases(layer):
    """The local MoE layer spec ``layer`` with :class:`ExpertRowParallelLinear` as its experts' ``linear_fc2``."""
    mlp = layer.submodules.mlp
    experts = mlp.submodules.experts
    experts = dataclasses.replace(experts, submodules=dataclasses.replace(experts.submodules,
                                                                          linear_fc2=ExpertRowParallelLinear))
    mlp = dataclasses.replace(mlp, submodules=dataclasses.replace(mlp.submodules, experts=experts))
    return dataclasses.replace(layer, submodules=dataclasses.replace(layer.submodules, mlp=mlp))


def check_layout(arch, tensor_parallel_size: int) -> None:
    """Refuse tensor parallelism for GPT-OSS (see the module docstring)."""
    if arch.attention_sinks and tensor_parallel_size > 1:
        from rlkit.errors import ModelError

        raise ModelError(f"GPT-OSS under tensor parallelism (TP={tensor_parallel_size}) is not supported yet: rlkit "
                         "does not map its per-head sinks and its biases to tensor-parallel shards. Fix: "
                         "policy.megatron_cfg.tensor_model_parallel_size=1 (expert parallelism works)")


def activation(arch):
    """The gate activation of ``arch``'s clamped SwiGLU (:func:`sigmoid_gate` at its ``swiglu_alpha``); Megatron's
    GLU clamps its input (``activation_func_clamp_value``) and adds 1 to the up part (``glu_linear_offset``)."""
    return functools.partial(sigmoid_gate, alpha=arch.swiglu_alpha)


def yarn_inv_freq(dim: int, base: float, factor: float, original_context: int, beta_fast: float, beta_slow: float,
                  truncate: bool) -> Tensor:
    """YaRN's inverse frequencies [dim / 2]: the fast ones as plain RoPE's (extrapolated), the slow ones divided by
    ``factor`` (interpolated), a linear ramp between the dims that turn ``beta_fast`` and ``beta_slow`` times over
    ``original_context`` positions (rounded outwards with ``truncate``)."""
    def dim_turning(turns: float) -> float:
        return dim * math.log(original_context / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_turning(beta_fast), dim_turning(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    high = high + 0.001 if low == high else high
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)  # 0: extrapolate
    plain = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    return plain / factor * ramp + plain * (1 - ramp)


def yarn_attention_factor(factor: float) -> float:
    """The factor YaRN multiplies cos and sin by: ``0.1 ln(factor) + 1`` (1 for factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


def softmax_scale(arch) -> float | None:
    """``head_dim ** -0.5`` times YaRN's attention factor squared (queries and keys each carry it once); None (Megatron's
    own ``head_dim ** -0.5``) without YaRN."""
    if arch.yarn is None:
        return arch.softmax_scale
    return (arch.softmax_scale or arch.head_dim ** -0.5) * yarn_attention_factor(arch.yarn[0]) ** 2


def use_yarn(model, arch) -> None:
    """Put YaRN's inverse frequencies in ``model``'s RoPE table (first pipeline stage: the one holding
    ``rotary_pos_emb``; every stage has it in Megatron's GPTModel)."""
    rope = getattr(model, "rotary_pos_emb", None)
    if arch.yarn is None or rope is None:
        return
    factor, original, fast, slow, truncate = arch.yarn
    inv_freq = yarn_inv_freq(arch.head_dim, arch.rope_theta, factor, original, fast, slow, truncate)
    rope.inv_freq = inv_freq.to(rope.inv_freq.device)
    type(rope).forward.cache_clear()  # Megatron caches the angles per sequence length (an lru_cache on the class)


# ---- conversion (full tensors) ---------------------------------------------------------------------
_ATTENTION = (("self_attention.linear_proj.bias", "self_attn.o_proj.bias"),
              ("self_attention.core_attention.softmax_offset", "self_attn.sinks"))
_ROUTER = (("mlp.router.weight", "mlp.router.weight"), ("mlp.router.bias", "mlp.router.bias"))


def experts_to_megatron(hf: Mapping[str, Tensor], i: int, num_experts: int) -> dict[str, Tensor]:
    """Layer ``i``'s stacked experts -> Megatron's per-expert fc1 ([gate; up]) and fc2, weights and biases."""
    h, m = f"model.layers.{i}.mlp.experts.", f"decoder.layers.{i}.mlp.experts.local_experts."
    gate_up, gate_up_bias = hf[h + "gate_up_proj"], hf[h + "gate_up_proj_bias"]  # [E, H, 2I], [E, 2I]
    down, down_bias = hf[h + "down_proj"], hf[h + "down_proj_bias"]  # [E, I, H], [E, H]
    out = {}
    for e in range(num_experts):
        out[f"{m}{e}.linear_fc1.weight"] = torch.cat([gate_up[e][:, 0::2].t(), gate_up[e][:, 1::2].t()]).contiguous()
        out[f"{m}{e}.linear_fc1.bias"] = torch.cat([gate_up_bias[e][0::2], gate_up_bias[e][1::2]])
        out[f"{m}{e}.linear_fc2.weight"] = down[e].t().contiguous()
        out[f"{m}{e}.linear_fc2.bias"] = down_bias[e]
    return out


def experts_to_hf(mc: Mapping[str, Tensor], i: int, num_experts: int) -> HFGroup:
    """Inverse of :func:`experts_to_megatron`: the four stacked tensors of layer ``i``."""
    h, m = f"model.layers.{i}.mlp.experts.", f"decoder.layers.{i}.mlp.experts.local_experts."
    fc1 = [mc[f"{m}{e}.linear_fc1.weight"] for e in range(num_experts)]  # [2I, H] each: [gate; up]
    fc1_bias = [mc[f"{m}{e}.linear_fc1.bias"] for e in range(num_experts)]
    gate_up = torch.stack([torch.stack(w.chunk(2), dim=1).flatten(0, 1).t() for w in fc1])  # [E, H, 2I] interleaved
    gate_up_bias = torch.stack([torch.stack(b.chunk(2), dim=1).flatten() for b in fc1_bias])
    down = torch.stack([mc[f"{m}{e}.linear_fc2.weight"].t() for e in range(num_experts)])
    down_bias = torch.stack([mc[f"{m}{e}.linear_fc2.bias"] for e in range(num_experts)])
    return [(h + "gate_up_proj", gate_up.contiguous()), (h + "gate_up_proj_bias", gate_up_bias),
            (h + "down_proj", down.contiguous()), (h + "down_proj_bias", down_bias)]


def layer_to_megatron(hf: Mapping[str, Tensor], i: int, arch) -> dict[str, Tensor]:
    """Full Megatron tensors of decoder layer ``i`` (attention from :mod:`.convert`, then what GPT-OSS adds)."""
    from rlkit.policy.megatron import convert

    h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
    out = convert.attention_to_megatron(hf, i, arch)
    out.update({m + mc: hf[h + x] for mc, x in _ATTENTION + _ROUTER})
    out.update(experts_to_megatron(hf, i, arch.num_experts))
    return out


def layer_to_hf(mc: Mapping[str, Tensor], i: int, arch) -> HFGroup:
    """Inverse of :func:`layer_to_megatron` (one group: a layer's attention, router and stacked experts)."""
    from rlkit.policy.megatron import convert

    h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
    return (convert.attention_to_hf(mc, i, arch) + [(h + x, mc[m + y]) for y, x in _ATTENTION + _ROUTER]
            + experts_to_hf(mc, i, arch.num_experts))


def layer_param_names(i: int, arch) -> list[str]:
    from rlkit.policy.megatron import convert

    m = f"decoder.layers.{i}."
    names = convert.attention_param_names(i, arch) + [m + y for y, _ in _ATTENTION + _ROUTER]
    for e in range(arch.num_experts):
        names += [f"{m}mlp.experts.local_experts.{e}.linear_fc{k}.{p}" for k in (1, 2) for p in ("weight", "bias")]
    return names
