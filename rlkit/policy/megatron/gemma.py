"""Gemma 3's (text) block for the Megatron policy: what its layers add to Llama's, each as a piece of the layer spec.

Gemma 3 computes, per layer, ``h = x + post_a(attn(pre_a(x)))`` and ``out = h + post_m(mlp(pre_m(h)))``: four norms,
each an RMSNorm that scales by ``1 + w`` (its weights are stored around 0), q/k RMSNorms per head (Qwen3's, with the
same ``1 + w``), a GELU-tanh gated MLP, the softmax scale ``query_pre_attn_scalar ** -0.5``, input embeddings
multiplied by ``sqrt(hidden_size)``, and two kinds of layers: local ones attend to the last ``sliding_window``
positions (the token itself included) and rotate with RoPE base ``rope_parameters.sliding_attention.rope_theta``
(1e4), global ones attend to the whole sequence with ``rope_parameters.full_attention.rope_theta`` (1e6).

Where each piece lives:

- the pre-norms are Megatron's ``input_layernorm`` / ``pre_mlp_layernorm`` slots, the post-norms ride on the
  branches' last linears (:class:`GemmaPostNormLinear`, OLMo 2's :class:`.post_norm.PostNormRowParallelLinear` with
  Gemma's norm), the final norm is the block's; all are :class:`OffsetRMSNorm`;
- GELU-tanh, the softmax scale and the window are Megatron's own options (``activation_func``, ``softmax_scale``,
  ``window_size`` with ``window_attn_skip_freq`` marking the local layers, :func:`.build.transformer_config`); the
  window is every windowed family's (:mod:`.sliding_window`: Mistral's, Phi-3's, GPT-OSS's too);
- the local layers' RoPE base: Megatron's ``GPTModel`` computes one table of angles for all layers (the global
  base). :class:`GemmaSelfAttention` turns it into the local one in each local layer: with no interpolation the
  table's first frequency is 1 (``base ** 0``), so its first column is each token's position, exactly, whatever the
  positions are (0..s-1, packed segments, or the per-row positions of :mod:`.shared_prompt`), and the local angles
  are ``position * inv_freq_local`` as transformers computes them;
- the embedding scale: a forward hook on the embedding (:func:`scale_embeddings`), the factor in the embedding's
  dtype as transformers rounds it (``sqrt(hidden)`` in bf16 is 55.5 for 3072, not 55.43).

Names (what :mod:`.convert` maps for ``Architecture.gemma``): ``input_layernorm`` <-> ``input_layernorm``,
``self_attention.linear_proj.post_norm`` <-> ``post_attention_layernorm``, ``pre_mlp_layernorm`` <->
``pre_feedforward_layernorm``, ``mlp.linear_fc2.post_norm`` <-> ``post_feedforward_layernorm``; q/k norms as Qwen3's.

Deliberate simplifications (refused by :class:`rlkit.policy.architecture.Architecture` with the reason): no logit
soft-capping (Gemma 2's; Gemma 3's released configs set none), no RoPE scaling of the global layers (the 4B-27B
models' text towers scale theirs linearly), no bidirectional attention. LoRA adapters on ``linear_proj`` / ``linear_fc2`` are added before the post-norms,
as OLMo 2's (:mod:`.post_norm`).
"""

from __future__ import annotations

import dataclasses

import torch
from megatron.core.transformer.attention import SelfAttention

from rlkit.policy.megatron.post_norm import PostNormRowParallelLinear


def _offset_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Gemma3RMSNorm: in fp32, ``x / rms(x) * (1 + w)``, then back to x's dtype."""
    normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return (normed * (1.0 + weight.float())).type_as(x)


class OffsetRMSNorm(torch.nn.Module):
    """Gemma's RMSNorm (scale ``1 + w``, weight [hidden] initialised to 0), built from Megatron's norm arguments and
    marked for sequence parallelism as :class:`rlkit.policy.megatron.norms.RMSNorm` is."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-6, **unused_megatron_options):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(hidden_size, dtype=config.params_dtype))
        self.weight.sequence_parallel = config.sequence_parallel
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _offset_rms_norm(x, self.weight, self.eps)


class HeadOffsetRMSNorm(OffsetRMSNorm):
    """Gemma's q/k norm: one weight [head_dim] for every head, input [s, b, heads/TP, head_dim]. Not marked for
    sequence parallelism: Megatron's ``finalize_model_grads`` sums its partial gradients over the tensor-parallel
    group by its ``q_layernorm``/``k_layernorm`` name, as for Qwen3's."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-6, **unused_megatron_options):
        super().__init__(config, hidden_size, eps)
        del self.weight.sequence_parallel


class GemmaPostNormLinear(PostNormRowParallelLinear):
    """The row-parallel linear of a branch followed by Gemma's post-norm over its full output."""

    norm_class = OffsetRMSNorm


def local_angles(global_angles: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """RoPE angles [s, b|1, 1, dim] (Megatron's layout, ``cat(freqs, freqs)``) at another base: each token's position
    read from the first column (frequency 1) of ``global_angles``, times ``inv_freq`` [dim/2]."""
    positions = global_angles[..., :1].float()
    freqs = positions * inv_freq.to(positions.device)
    return torch.cat((freqs, freqs), dim=-1).to(global_angles.dtype)


class GemmaSelfAttention(SelfAttention):
    """Megatron's self-attention that, in a local layer (``local_layers[layer_number - 1]``: Megatron's layer numbers
    count from 1 over the whole model), rotates with the local RoPE base. Needs ``rotary_interleaved=False`` and no
    ``seq_len_interpolation_factor`` (see the module docstring)."""

    def __init__(self, config, submodules, layer_number: int, *args, local_layers: tuple[int, ...] = (),
                 local_rope_theta: float = 10_000.0, **kwargs):
        super().__init__(config, submodules, layer_number, *args, **kwargs)
        self.local = bool(local_layers) and bool(local_layers[layer_number - 1])
        dim = int(config.kv_channels * getattr(config, "rotary_percent", 1.0))
        inv_freq = 1.0 / (local_rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        self.register_buffer("local_inv_freq", inv_freq, persistent=False)

    def forward(self, *args, rotary_pos_emb=None, **kwargs):
        if self.local and rotary_pos_emb is not None:
            if isinstance(rotary_pos_emb, tuple):
                rotary_pos_emb = tuple(None if e is None else local_angles(e, self.local_inv_freq)
                                       for e in rotary_pos_emb)
            else:
                rotary_pos_emb = local_angles(rotary_pos_emb, self.local_inv_freq)
        return super().forward(*args, rotary_pos_emb=rotary_pos_emb, **kwargs)


def gemma_layer(layer, arch):
    """The local layer spec ``layer`` (dense, Qwen3's q/k norms) turned into Gemma 3's block for ``arch``."""
    attention = layer.submodules.self_attention
    local = dict(local_layers=tuple(arch.local_layers or ()), local_rope_theta=arch.local_rope_theta or arch.rope_theta)
    attention = dataclasses.replace(
        attention, module=GemmaSelfAttention, params=dict(attention.params, **local),
        submodules=dataclasses.replace(attention.submodules, linear_proj=GemmaPostNormLinear,
                                       q_layernorm=HeadOffsetRMSNorm, k_layernorm=HeadOffsetRMSNorm))
    mlp = layer.submodules.mlp
    mlp = dataclasses.replace(mlp, submodules=dataclasses.replace(mlp.submodules, linear_fc2=GemmaPostNormLinear))
    return dataclasses.replace(layer, submodules=dataclasses.replace(
        layer.submodules, input_layernorm=OffsetRMSNorm, pre_mlp_layernorm=OffsetRMSNorm, self_attention=attention,
        mlp=mlp))


def scale_embeddings(model, hidden_size: int) -> None:
    """Multiply the output of ``model``'s embedding (first pipeline stage only) by ``sqrt(hidden_size)``, rounded to
    the embedding's dtype as transformers' Gemma3TextScaledWordEmbedding rounds it."""
    embedding = getattr(model, "embedding", None)
    if embedding is None:
        return
    scale = hidden_size ** 0.5

    def scaled(module, args, output):
        return output * torch.tensor(scale, dtype=output.dtype, device=output.device)

    embedding.register_forward_hook(scaled)

