"""Build a Megatron-Core ``GPTModel`` that matches an HF Llama (2, 3.x) / Qwen2 / Qwen3 config.

The mapping of architecture knobs (verified to ~1e-7 in fp32 against transformers), each a native Megatron
option: RMSNorm with ``layernorm_epsilon = rms_norm_eps``; SwiGLU (``gated_linear_unit`` + SiLU); RoPE with
``rotary_base = rope_theta`` and no permutation of the HF weights; Llama 3.x's ``rope_type: llama3``
frequency scaling with ``rope_scaling`` / ``rope_scaling_factor``; partial RoPE (Phi-4-mini's
``partial_rotary_factor``: the first dims of each head turn, as in HF) with ``rotary_percent``; SmolLM3's layers
without RoPE (``no_rope_layers``) with ``no_rope_freq``; OLMo 2's norms after attention and the MLP and its q/k
norms over the whole projection with the layer spec of :mod:`.post_norm`; Gemma 3's block (four (1+w) norms, GELU-tanh,
``query_pre_attn_scalar`` as ``softmax_scale``, local layers' window as ``window_size`` / ``window_attn_skip_freq`` and
their own RoPE base, embeddings scaled by sqrt(hidden)) with :mod:`.gemma`; DeepSeek-V3's latent attention with
``MLATransformerConfig`` and the MLA layer spec (:mod:`.mla`), its dense first layers by ``moe_layer_freq``; GPT-OSS's
sinks (``softmax_type="learnable"``), biases (``add_bias_linear``), clamped SwiGLU and YaRN with :mod:`.gpt_oss`; GQA with
``num_query_groups = num_key_value_heads`` and ``kv_channels = head_dim`` (Qwen3's head_dim is its own
setting, not hidden / heads); Qwen3's per-head q/k RMSNorm with ``qk_layernorm``; no linear biases except
the QKV bias of Qwen2; tied or untied output layer.

What is refused (RoPE scalings other than llama3's, sliding-window attention) is refused by
:class:`rlkit.policy.architecture.Architecture`, which every backend reads.

Causal attention comes from the layer spec's mask type (``AttnMaskType.causal``): no mask tensor is passed; on
CUDA torch's ``scaled_dot_product_attention`` computes it as a flag (:mod:`.attention`), never a [T, T] mask.

Deliberate simplifications: the local (non-Transformer-Engine) layer spec with torch's RMSNorm (marked for
sequence parallelism, see :class:`rlkit.policy.megatron.norms.RMSNorm`), no dropout. Transformer Engine's spec fuses
each norm into the next linear layer (other parameter names than :mod:`.convert` maps) and is not built yet.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import torch
import torch.nn.functional as F

from rlkit.policy.architecture import Architecture
from rlkit.policy.megatron import gemma, gpt_oss, sliding_window
from rlkit.policy.megatron.cpu import cuda_literals_on_cpu
from rlkit.policy.megatron.norms import HeadRMSNorm, RMSNorm


def transformer_config(arch: Architecture, tensor_parallel_size: int = 1, sequence_parallel: bool = False,
                       pipeline_parallel_size: int = 1, params_dtype=torch.float32,
                       recompute: Optional[Mapping[str, Any]] = None, initialize: bool = True):
    """Megatron's config for ``arch`` with parameters in ``params_dtype`` (bfloat16 also sets Megatron's ``bf16``
    flag, which ``Float16Module`` reads). Pipeline settings: activations travel in ``params_dtype``, point-to-point
    ops are batched only on GPUs (the batched path synchronises CUDA), and the schedule leaves the loss as
    the policy's loss function normalised it (``calculate_per_token_loss``, see ``pipeline.run_schedule``).
    ``recompute``: Megatron's activation recompute settings (``recompute_granularity``, ``recompute_method``,
    ``recompute_num_layers``: ``MegatronConfig.recompute_settings()``); None: every activation is kept.
    ``initialize=False`` (Megatron's ``perform_initialization``) leaves the weights as ``torch.empty`` made them, for
    a model whose every weight is read from a checkpoint next: on the CPU Megatron's initialisation otherwise
    writes every weight through an fp32 temporary of its full size, and those pages stay resident (at the
    Qwen3-0.6B shape 1.4 GB of glibc heap left behind, and 0.9 GB more at the load's peak)."""
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    make = MLATransformerConfig if arch.kv_lora_rank else TransformerConfig
    return make(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_attention_heads,
        num_query_groups=arch.num_key_value_heads,
        kv_channels=arch.head_dim,
        ffn_hidden_size=arch.ffn_hidden_size,
        tensor_model_parallel_size=tensor_parallel_size,
        sequence_parallel=sequence_parallel,
        pipeline_model_parallel_size=pipeline_parallel_size,
        pipeline_dtype=params_dtype,
        batch_p2p_comm=torch.cuda.is_available(),
        calculate_per_token_loss=True,
        normalization="RMSNorm",
        layernorm_epsilon=arch.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=gpt_oss.activation(arch) if arch.swiglu_limit else _ACTIVATIONS[arch.activation],
        activation_func_clamp_value=arch.swiglu_limit,  # GPT-OSS's clamped SwiGLU: (up + 1) * gate(gate)
        glu_linear_offset=1.0 if arch.swiglu_limit else 0.0,
        softmax_type="learnable" if arch.attention_sinks else "vanilla",  # GPT-OSS's sinks
        softmax_scale=gpt_oss.softmax_scale(arch),
        add_bias_linear=arch.linear_bias,
        add_qkv_bias=arch.qkv_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=params_dtype,
        bf16=params_dtype == torch.bfloat16,
        use_cpu_initialization=not torch.cuda.is_available(),
        perform_initialization=initialize,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        attention_softmax_in_fp32=True,
        qk_layernorm=arch.qk_layernorm,
        no_rope_freq=list(arch.no_rope_layers) if arch.no_rope_layers else None,
        **sliding_window.window_settings(arch),
        **_mla_settings(arch),
        **(recompute or {}),
    )


def _mla_settings(arch: Architecture) -> dict:
    """DeepSeek-V3's latent attention (:mod:`.mla`) as ``MLATransformerConfig`` options: plain RoPE (no YaRN, so no
    softmax rescaling: ``mscale`` 1, ``mscale_all_dim`` 0) with the query/key head split and the latents' ranks."""
    if not arch.kv_lora_rank:
        return {}
    return dict(multi_latent_attention=True, q_lora_rank=arch.q_lora_rank, kv_lora_rank=arch.kv_lora_rank,
                qk_head_dim=arch.qk_nope_head_dim, qk_pos_emb_head_dim=arch.qk_rope_head_dim,
                v_head_dim=arch.v_head_dim, rope_type="rope", rotary_base=arch.rope_theta, rotary_scaling_factor=1.0,
                mscale=1.0, mscale_all_dim=0.0)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:  # transformers' gelu_pytorch_tanh (Gemma's MLP)
    return F.gelu(x, approximate="tanh")


_ACTIVATIONS = {"silu": F.silu, "gelu_tanh": _gelu_tanh}


def block_spec(config, arch: Architecture, num_experts: int = 0):
    """The local (non-Transformer-Engine) layer spec, dense or MoE, with
    :class:`rlkit.policy.megatron.norms.RMSNorm` for every norm and the core attention of
    :func:`rlkit.policy.megatron.attention.core_attention`, for the layers this pipeline stage builds; OLMo 2's,
    Gemma 3's and DeepSeek-V3's (latent attention, dense first layers: ``config.moe_layer_freq`` as a list) blocks
    where ``arch`` is one."""
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    pattern = config.moe_layer_freq if num_experts and isinstance(config.moe_layer_freq, list) else None
    offset, count = get_transformer_layer_offset(config), get_num_layers_to_build(config)
    moe, dense = _layer_spec(config, arch, num_experts), _layer_spec(config, arch, 0) if pattern else None
    layers = [moe if pattern is None or pattern[i] else dense for i in range(offset, offset + count)]
    return TransformerBlockSubmodules(layer_specs=layers, layer_norm=gemma.OffsetRMSNorm if arch.gemma else RMSNorm)


def _layer_spec(config, arch: Architecture, num_experts: int):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from rlkit.policy.megatron.attention import core_attention

    layer = get_gpt_layer_local_spec(num_experts=num_experts or None, moe_grouped_gemm=False, normalization="RMSNorm",
                                     qk_layernorm=config.qk_layernorm,
                                     multi_latent_attention=bool(arch.kv_lora_rank))
    if arch.kv_lora_rank:  # DeepSeek-V3
        from rlkit.policy.megatron import mla

        layer = mla.spec_with_mla(layer, RMSNorm)
    else:
        attention = layer.submodules.self_attention
        norms = dict(q_layernorm=HeadRMSNorm, k_layernorm=HeadRMSNorm) if config.qk_layernorm else {}
        attention = dataclasses.replace(attention, submodules=dataclasses.replace(
            attention.submodules, core_attention=core_attention(sinks=arch.attention_sinks), **norms))
        layer = dataclasses.replace(layer, submodules=dataclasses.replace(layer.submodules, self_attention=attention))
    layer = dataclasses.replace(layer, submodules=dataclasses.replace(
        layer.submodules, input_layernorm=RMSNorm, pre_mlp_layernorm=RMSNorm))
    if arch.linear_bias and num_experts:  # GPT-OSS's biased experts
        layer = gpt_oss.spec_with_expert_biases(layer)
    if arch.post_norms:  # OLMo 2's block
        from rlkit.policy.megatron.post_norm import post_norm_layer

        layer = post_norm_layer(layer, config)
    if arch.gemma:
        layer = gemma.gemma_layer(layer, arch)
    return layer


def bf16_twin_of(master, arch: Architecture, config, num_experts: int = 0, lora=None, seed: int = 0):
    """The bf16 compute copy of the fp32 ``master`` GPTModel (:class:`rlkit.policy.precision.Bf16Twin`) and
    the module to run it through: Megatron's ``Float16Module``, which casts its float inputs to bf16 on the
    first pipeline stage and its output (the logits) to fp32 on the last, so logprobs and the loss are fp32.
    ``config`` is the master's; the copy is built from it with bf16 parameters, and with the master's adapters
    (``lora``: the enabled ``policy.lora_cfg``) when it has them; then the frozen base is held once, in bf16
    (the master's base parameters become the copy's), and the caller loads the weights after."""
    from megatron.core.transformer.module import Float16Module

    from rlkit.policy.precision import Bf16Twin

    bf16_config = dataclasses.replace(config, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16, bf16=True)
    if lora is not None:  # the master's frozen base, not loaded yet (the policy reads it into the copy's), freed
        for param in master.parameters():  # first: the fp32 base and the bf16 copy are never resident together
            if not param.requires_grad:
                param.untyped_storage().resize_(0)
    compute = build_gpt_model(arch, bf16_config, num_experts)
    if lora is not None:
        from rlkit.policy.megatron.lora import add_adapters

        add_adapters(compute, lora, seed)
    return Bf16Twin(master, compute, share_frozen=lora is not None), Float16Module(bf16_config, compute)


def data_parallel_wrapper(module, ddp_cfg):
    """Megatron's ``DistributedDataParallel`` around ``module`` (the GPTModel, or at bf16 the ``Float16Module``
    that runs its bf16 copy), configured by ``policy.megatron_cfg.distributed_data_parallel_config``: each
    parameter's gradient accumulates into ``param.main_grad``, a view of a contiguous buffer (fp32 with
    ``grad_reduce_in_fp32``), and is reduced bucket by bucket. No gradient is averaged: the module's config
    has ``calculate_per_token_loss``, so the buffers are summed over data parallel, as rlkit's losses (normalised
    by global counts) need. The config's ``no_sync_func`` is DDP's, so Megatron's pipeline schedule holds the
    reduce until the last microbatch (the policy clears it on close). Runs on the CPU over gloo too: its
    buffers are allocated on ``torch.cuda.current_device()``, which :mod:`.cpu` makes the CPU."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp = DistributedDataParallel(module.config, DistributedDataParallelConfig(**ddp_cfg.model_dump()), module)
    module.config.no_sync_func = ddp.no_sync
    return ddp


def build_gpt_model(arch: Architecture, config, num_experts: int = 0):
    """This pipeline stage's ``GPTModel`` with random weights in the layout of ``arch`` (Megatron ``config``
    from :func:`transformer_config`, extended with the MoE settings when ``num_experts``). Needs Megatron's
    parallel state."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel

    if arch.kv_lora_rank:
        from rlkit.policy.megatron.mla import apply_mla_fallbacks

        apply_mla_fallbacks()

    with cuda_literals_on_cpu():  # a tied embedding's copy on the last pipeline stage is moved with .cuda()
        model = GPTModel(
            config=config,
            transformer_layer_spec=block_spec(config, arch, num_experts),
            vocab_size=arch.vocab_size,
            max_sequence_length=arch.max_position_embeddings,
            pre_process=parallel_state.is_pipeline_first_stage(),
            post_process=parallel_state.is_pipeline_last_stage(),
            parallel_output=True,
            share_embeddings_and_output_weights=arch.tie_word_embeddings,
            position_embedding_type="rope",
            rotary_base=int(arch.rope_theta),
            rotary_percent=arch.rotary_percent,
            rope_scaling=arch.rope_scaling_factor is not None,
            rope_scaling_factor=arch.rope_scaling_factor or 8.0,
        )
    if not config.perform_initialization:
        mark_tensor_parallel_weights(model)
    if arch.gemma:
        gemma.scale_embeddings(model, arch.hidden_size)
    gpt_oss.use_yarn(model, arch)
    if torch.cuda.is_available():
        model = model.cuda()
    return model


def mark_tensor_parallel_weights(model) -> None:
    """Give each tensor-parallel weight of ``model`` the attributes Megatron's initialisation would have set
    (``tensor_model_parallel``, ``partition_dim``, ``partition_stride``; Megatron sets them inside the initialisation,
    which ``perform_initialization=False`` skips): the vocabulary-parallel embedding's and column-parallel linears'
    weights split on dim 0 (a gated MLP's ``linear_fc1`` with stride 2, as ``MLP`` builds it), row-parallel linears'
    on dim 1, GroupedMLP's ``weight1`` on 1 and ``weight2`` on 0. Without them Megatron counts a sharded weight as a
    copy held by every rank (``param_is_not_tensor_parallel_duplicate``), and the gradient norm under tensor
    parallelism comes out wrong. A weight that has them already keeps its own."""
    from megatron.core.tensor_parallel.layers import (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding,
                                                      set_tensor_model_parallel_attributes)
    from megatron.core.transformer.mlp import MLP
    from megatron.core.transformer.moe.experts import GroupedMLP

    strided = {id(m.linear_fc1) for m in model.modules()
               if isinstance(m, MLP) and m.config.gated_linear_unit and not m.config.use_kitchen}
    for module in model.modules():
        if isinstance(module, (VocabParallelEmbedding, ColumnParallelLinear)):
            marks = [(module.weight, 0, 2 if id(module) in strided else 1)]
        elif isinstance(module, RowParallelLinear):
            marks = [(module.weight, 1, 1)]
        elif isinstance(module, GroupedMLP):
            marks = [(module.weight1, 1, 1), (module.weight2, 0, 1)]
        else:
            continue
        for weight, dim, stride in marks:
            if weight is not None and not hasattr(weight, "tensor_model_parallel"):
                set_tensor_model_parallel_attributes(weight, True, dim, stride)
