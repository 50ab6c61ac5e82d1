"""OLMo 2's block for the Megatron policy: norms after attention and after the MLP, q/k norms over the projection.

OLMo 2 computes ``h = x + norm_a(attn(x))`` and ``out = h + norm_m(mlp(h))``: no norm before attention or the MLP,
one on each branch's output before the residual add. Its q and k norms are RMSNorms over the whole projection
(every head of a token together, weights [heads * head_dim]), where Qwen3's normalise each head alone.

Megatron-Core 0.16's layer has no slot for a norm after a branch, so each branch's last linear carries it:
:class:`PostNormRowParallelLinear` is the row-parallel linear (``linear_proj``, ``linear_fc2``) followed by an
RMSNorm over its full output (after the tensor-parallel reduce; under sequence parallelism over this rank's
tokens, the weight marked for the gradient sum as :class:`rlkit.policy.megatron.norms.RMSNorm` does). The
pre-norms are ``IdentityOp``. :class:`ProjectionRMSNorm` fills Megatron's ``q_layernorm`` / ``k_layernorm`` slots
(which see this rank's heads [s, b, heads/TP, d]): the sum of squares is all-reduced over the tensor-parallel
group (autograd-aware: every rank's tokens depend on every rank's heads), and each rank holds the whole weight and
uses its heads' slice, so conversion stays unsharded and Megatron's ``finalize_model_grads`` sums the weight's
partial gradients over the group by its ``q_layernorm``/``k_layernorm`` name, as for Qwen3's.

Names (what :mod:`.convert` maps for ``Architecture.post_norms``):
``...self_attention.linear_proj.post_norm.weight`` <-> ``model.layers.i.post_attention_layernorm.weight``,
``...mlp.linear_fc2.post_norm.weight`` <-> ``model.layers.i.post_feedforward_layernorm.weight``.

LoRA: an adapter on ``linear_proj`` / ``linear_fc2`` is added by :class:`PostNormRowParallelLinear` itself, to the
linear's output before the norm (an ordinary linear gets it from a forward hook, which here would add it after).

Deliberate simplifications: dense layers only; KV groups split whole over tensor-parallel
ranks (no replicated KV heads).
"""

from __future__ import annotations

import dataclasses

import torch
from megatron.core.tensor_parallel.layers import RowParallelLinear
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.spec_utils import ModuleSpec

from rlkit.errors import ModelError
from rlkit.policy.megatron.norms import RMSNorm


class ProjectionRMSNorm(torch.nn.Module):
    """RMSNorm over every head of a token's query (or key) projection; weight [heads * head_dim], whole on every
    tensor-parallel rank. Input [s, b, heads/TP, head_dim] -> the same shape."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, heads: int = 1, **unused_megatron_options):
        super().__init__()
        if heads % config.tensor_model_parallel_size:
            raise ModelError(f"OLMo 2's q/k norms over {heads} heads cannot be split over tensor_model_parallel_size="
                             f"{config.tensor_model_parallel_size} (replicated KV heads would count twice in the norm). "
                             "Fix: a tensor-parallel size that divides num_key_value_heads")
        self.weight = torch.nn.Parameter(torch.ones(heads * hidden_size, dtype=config.params_dtype))
        self.eps, self.width = eps, heads * hidden_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from megatron.core import parallel_state as ps

        flat = x.reshape(*x.shape[:2], -1)
        squares = flat.float().pow(2).sum(-1, keepdim=True)
        size = ps.get_tensor_model_parallel_world_size()
        if size > 1:
            import torch.distributed.nn.functional as dist_fn

            squares = dist_fn.all_reduce(squares, group=ps.get_tensor_model_parallel_group())
        part = flat.shape[-1]
        weight = self.weight[ps.get_tensor_model_parallel_rank() * part:][:part] if size > 1 else self.weight
        normed = flat.float() * torch.rsqrt(squares / self.width + self.eps)
        return (weight * normed.to(x.dtype)).view_as(x)


class PostNormRowParallelLinear(RowParallelLinear):
    """Megatron's row-parallel linear with an RMSNorm over its output (see the module docstring); ``norm_class``:
    the norm (Gemma 3's block puts its own there, :mod:`.gemma`)."""

    norm_class = RMSNorm

    def __init__(self, input_size: int, output_size: int, *, config, **kwargs):
        super().__init__(input_size, output_size, config=config, **kwargs)
        self.post_norm = self.norm_class(config, output_size, eps=config.layernorm_epsilon)

    # a LoRA adapter's update (rlkit.policy.megatron.lora) belongs to the linear, so before the norm: this class
    # adds it itself, where a plain linear gets it from a forward hook on its output
    adds_adapter_update = True

    def forward(self, x: torch.Tensor):
        out, bias = super().forward(x)
        adapter = self._modules.get("adapter")
        if adapter is not None and adapter.enabled:
            out = out + adapter(x).to(out.dtype)
        return self.post_norm(out), bias


def post_norm_layer(layer, config):
    """The local layer spec ``layer`` (dense) turned into OLMo 2's block."""
    attention = layer.submodules.self_attention
    norm = dict(q_layernorm=ModuleSpec(module=ProjectionRMSNorm, params={"heads": config.num_attention_heads}),
                k_layernorm=ModuleSpec(module=ProjectionRMSNorm, params={"heads": config.num_query_groups}))
    attention = dataclasses.replace(attention, submodules=dataclasses.replace(
        attention.submodules, linear_proj=PostNormRowParallelLinear, **norm))
    mlp = layer.submodules.mlp
    mlp = dataclasses.replace(mlp, submodules=dataclasses.replace(mlp.submodules, linear_fc2=PostNormRowParallelLinear))
    return dataclasses.replace(layer, submodules=dataclasses.replace(
        layer.submodules, input_layernorm=IdentityOp, pre_mlp_layernorm=IdentityOp, self_attention=attention, mlp=mlp))
