"""The model families rlkit makes, converts and trains: one row each, read by every other module.

A family's name is spelled one way everywhere (``qwen2-moe``: ``policy.model_family``, ``--family``,
``Architecture.family``). Adding a family is a row here; what else it needs is code for what is new in
it (a preset's config in :func:`rlkit.models.factory.hf_config`, a weight mapping the converters lack).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal, Optional


@dataclass(frozen=True)
class Family:
    """What rlkit needs to know of a decoder family beyond its ``config.json``."""

    name: str  # as users spell it
    architecture: str  # the HF class in config.json's "architectures"
    config_class: str  # transformers' config class that makes a preset of it
    moe: bool = False  # Mixture-of-Experts: every layer's MLP is routed experts
    qkv_bias: bool = False  # Qwen2: biases on the q, k and v projections
    qk_norm: bool = False  # Qwen3: RMSNorm over each query and key head before RoPE
    fused_projections: bool = False  # Phi-3: qkv_proj and gate_up_proj stored fused in the checkpoint
    post_norms: bool = False  # OLMo 2: norms after attention and the MLP, none before; q/k norms over the projection
    gemma: bool = False  # Gemma 3: (1+w) RMSNorm, embeddings x sqrt(hidden), norms before and after attention and MLP
    mla: bool = False  # DeepSeek-V3: multi-head latent attention; dense first layers, sigmoid group routing
    gpt_oss: bool = False  # GPT-OSS: attention sinks, biased router and experts (stored stacked), clamped SwiGLU, YaRN
    vllm_cpu: str | None = None  # why vLLM on the CPU does not sample as the policy computes (measured); None: it does
    expert_prefix: str = "mlp."  # where a layer's experts live in the HF checkpoint
    shared_expert: str = "shared_expert."  # its shared expert(s), under expert_prefix (Qwen2-MoE: gated)
    expert_names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")  # an expert's gate, up, down


# measured with vllm-cpu 0.32.0 on the nano-moe preset's shape (fp32, an 80-token prompt's logprobs)
GPT_OSS_ON_VLLM_CPU = ("vLLM's GPT-OSS model on the CPU gives logprobs 5e-3 to 1.3e-2 off transformers' fp32 forward "
                       "(measured with vllm-cpu 0.32.0, also with the sinks, the window, YaRN and every bias turned off), "
                       "above the 1e-3 a refit generator must agree with the policy")

FAMILIES = (
    Family("llama", "LlamaForCausalLM", "LlamaConfig"),
    Family("llama3", "LlamaForCausalLM", "LlamaConfig"),  # Llama 3.x's RoPE scaling
    Family("qwen2", "Qwen2ForCausalLM", "Qwen2Config", qkv_bias=True),
    Family("qwen3", "Qwen3ForCausalLM", "Qwen3Config", qk_norm=True),
    Family("mistral", "MistralForCausalLM", "MistralConfig"),  # Llama's layout; its sliding_window in every layer
    Family("phi3", "Phi3ForCausalLM", "Phi3Config", fused_projections=True),  # Phi-3, Phi-4-mini
    Family("smollm3", "SmolLM3ForCausalLM", "SmolLM3Config"),  # Llama's layout; no_rope_layers read from its config
    Family("olmo2", "Olmo2ForCausalLM", "Olmo2Config", qk_norm=True, post_norms=True),
    # GELU-tanh MLP, query_pre_attn_scalar, local (sliding-window) and global layers read from its config
    Family("gemma3", "Gemma3ForCausalLM", "Gemma3TextConfig", qk_norm=True, gemma=True),
    Family("mixtral", "MixtralForCausalLM", "MixtralConfig", moe=True, expert_prefix="block_sparse_moe.",
           expert_names=("w1", "w3", "w2")),
    Family("qwen2-moe", "Qwen2MoeForCausalLM", "Qwen2MoeConfig", moe=True, qkv_bias=True),
    Family("qwen3-moe", "Qwen3MoeForCausalLM", "Qwen3MoeConfig", moe=True, qk_norm=True),
    # MLA; the first first_k_dense_replace layers dense; sigmoid routing with a score-correction bias, group-limited
    Family("deepseek-v3", "DeepseekV3ForCausalLM", "DeepseekV3Config", moe=True, mla=True, shared_expert="shared_experts."),
    # learnable attention sinks, sliding-window and full layers alternating, YaRN, biases on attention, router and experts
    Family("gpt-oss", "GptOssForCausalLM", "GptOssConfig", moe=True, qkv_bias=True, gpt_oss=True,
           vllm_cpu=GPT_OSS_ON_VLLM_CPU),
)
FAMILY_NAMES = tuple(f.name for f in FAMILIES)
MOE_FAMILIES = tuple(f.name for f in FAMILIES if f.moe)
DENSE_FAMILIES = tuple(f.name for f in FAMILIES if not f.moe)
ModelFamily = Literal[FAMILY_NAMES]  # type: ignore[valid-type]
BY_NAME = {f.name: f for f in FAMILIES}
SUPPORTED_ARCHITECTURES = tuple(dict.fromkeys(f.architecture for f in FAMILIES))


def family_of(architectures: Iterable[str]) -> Optional[Family]:
    """The family of an HF config's ``architectures`` (the first row of its class: ``llama`` for a Llama 3.x
    folder, whose scaling is read from its config), or None when rlkit does not support it."""
    archs = list(architectures or ())
    return next((f for f in FAMILIES if f.architecture in archs), None)
