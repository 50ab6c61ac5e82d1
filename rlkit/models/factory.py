"""Tiny HF-format models, made offline, that transformers, vLLM and the Megatron policy all load.

No model hub is reachable from our machines, so rlkit makes its own models: random-init decoders of every
family the policy supports (Llama, Llama 3.x with its RoPE scaling, Qwen2 with QKV bias, Qwen3 with q/k norms,
Mistral with a sliding window in every layer, Phi-3 with fused projections, Phi-4-mini's partial RoPE and a window, SmolLM3 with layers without RoPE, OLMo 2 with
its norms after attention and MLP, Gemma 3 (text) with its local sliding-window layers, and the Mixture-of-Experts
families Mixtral, Qwen2-MoE with its gated shared expert, Qwen3-MoE, DeepSeek-V3 with its latent attention, GPT-OSS with its sinks and YaRN), saved the way transformers saves a real
checkpoint, with the character tokenizer of :mod:`rlkit.models.tokenizer`. A folder holds ``config.json``,
``model.safetensors`` and the tokenizer files with a chat template.

Every preset uses a ``head_dim`` that vLLM's CPU attention kernels accept (see :data:`VLLM_CPU_HEAD_DIMS`; DeepSeek-V3's
latent attention is sized otherwise, and its presets generate with transformers on the CPU: rlkit.config.checks)
and a vocabulary padded to a multiple of 128 (the tokenizer has 103 tokens; the padding rows are never
sampled by a trained model and make the vocabulary divisible by any tensor-parallel size up to 128).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from safetensors import safe_open

from rlkit.errors import ModelError
from rlkit.models.families import BY_NAME, FAMILY_NAMES, MOE_FAMILIES, SUPPORTED_ARCHITECTURES, ModelFamily, family_of
from rlkit.models.folder import check_weight_files, read_json_object
from rlkit.models.tokenizer import TokenizerKind, save_tokenizer, tokenizer_vocab_size

if TYPE_CHECKING:  # torch and transformers are imported by the functions that build a model: the config's checks
    import torch  # read this module's tables and rules, and load no torch

# Llama 3.1 / 3.2's RoPE scaling: low/high frequency factors and original context as Megatron-Core applies them
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
VLLM_CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
# vLLM's MLA backends (DeepSeek-V3's latent attention; vllm-cpu's CPU_MLA among them) take these sizes of the latent
# plus the RoPE key, kv_lora_rank + qk_rope_head_dim (DeepSeek-V3: 512 + 64)
VLLM_MLA_HEAD_DIMS = (320, 512, 576)


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of a tiny decoder. ``head_dim = hidden_size // num_attention_heads``."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int = 128
    max_position_embeddings: int = 512
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    num_experts: int = 0  # > 0: a Mixture-of-Experts model (an MoE family); intermediate_size is per expert
    num_experts_per_tok: int = 2

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


# Parameter counts are for the llama family with untied embeddings and the 128-token vocabulary.
PRESETS: dict[str, TinyModelSpec] = {
    "nano": TinyModelSpec(64, 2, 2, 1, 192),  # ~0.1M: unit tests
    "tiny": TinyModelSpec(128, 4, 4, 2, 384),  # ~0.8M: the quickstart task
    "small": TinyModelSpec(512, 6, 8, 4, 1536),  # ~20M: refit and step benchmarks
    "medium": TinyModelSpec(640, 10, 10, 5, 1792),  # ~48M
    "nano-moe": TinyModelSpec(64, 2, 2, 1, 96, num_experts=4),  # ~0.19M, 4 experts, top-2: MoE unit tests
    "tiny-moe": TinyModelSpec(128, 4, 4, 2, 192, num_experts=8),  # ~2.6M, 8 experts, top-2 (family mixtral)
}


def head_dim_of(model_config: Mapping[str, Any]) -> int:
    """An HF config's attention head size: ``head_dim``, else ``hidden_size / num_attention_heads``."""
    heads = model_config.get("num_attention_heads") or 1
    return model_config.get("head_dim") or (model_config.get("hidden_size") or 0) // heads


def vllm_attention_size(model_config: Mapping[str, Any]) -> tuple[str, int, tuple[int, ...]]:
    """What vLLM's attention kernels size a model's attention by: (its name, the model's value, the values they take).
    Multi-head latent attention (a ``kv_lora_rank``) is sized by the latent plus the RoPE key."""
    if model_config.get("kv_lora_rank"):
        return ("kv_lora_rank + qk_rope_head_dim", model_config["kv_lora_rank"] + model_config["qk_rope_head_dim"],
                VLLM_MLA_HEAD_DIMS)
    return "head_dim", head_dim_of(model_config), VLLM_CPU_HEAD_DIMS


def check_head_dim(head_dim: int) -> None:
    """vLLM's CPU attention fails at the first generate on other head sizes; say so before it starts."""
    refusal = head_dim_refusal(head_dim)
    if refusal is not None:
        raise ModelError(refusal)


def head_dim_refusal(head_dim: int) -> str | None:
    """Why vLLM's CPU attention cannot run ``head_dim``, with the fix; None where it can."""
    if head_dim in VLLM_CPU_HEAD_DIMS:
        return None
    return (f"head_dim={head_dim} is not supported by vLLM's CPU attention kernels "
            f"(supported: {', '.join(map(str, VLLM_CPU_HEAD_DIMS))}). Fix: use a model whose head size "
            "(hidden_size / num_attention_heads) is one of those, or set policy.generation.backend=hf")


def vllm_cpu_family_refusal(model_config: Mapping[str, Any]) -> str | None:
    """Why vLLM on the CPU does not sample the model of ``model_config`` as the policy computes it, from its family's
    row (:attr:`rlkit.models.families.Family.vllm_cpu`: GPT-OSS); None where the family runs there."""
    family = family_of(model_config.get("architectures") or ())
    return None if family is None else family.vllm_cpu


def vllm_cpu_refusal(model_config: Mapping[str, Any]) -> str | None:
    """Why vLLM on the CPU cannot run the model of ``model_config`` (an HF config's dict), with the fix; None where it
    can: its family (:func:`vllm_cpu_family_refusal`), then its attention size by :func:`vllm_attention_size` (the head
    size, or MLA's latent plus RoPE key)."""
    if (reason := vllm_cpu_family_refusal(model_config)) is not None:
        return f"{reason}. Fix: set policy.generation.backend=hf (or megatron)"
    name, size, sizes = vllm_attention_size(model_config)
    if name == "head_dim":
        return head_dim_refusal(size)
    if size in sizes:
        return None
    return (f"{name}={size} is not supported by vLLM's CPU attention kernels (supported: "
            f"{', '.join(map(str, sizes))}). Fix: set policy.generation.backend=hf (or megatron)")


def hf_config(spec: TinyModelSpec, family: ModelFamily):
    """A transformers config object for ``spec`` in ``family`` (MoE families route without a load-balancing
    loss, the setting recommended for RL; Qwen2-MoE's shared expert is twice an expert's width)."""
    import transformers as tf

    fields = config_fields(spec, family)
    return getattr(tf, BY_NAME[family].config_class)(**fields)


def preset_config(spec: TinyModelSpec, family: ModelFamily) -> dict:
    """What the config's checks read of the model a preset makes: the fields :func:`hf_config` sets (its class's
    defaults aside) and the ``architectures`` the saved folder names; no transformers, so no torch, is loaded."""
    return dict(config_fields(spec, family), architectures=[BY_NAME[family].architecture])


def config_fields(spec: TinyModelSpec, family: ModelFamily) -> dict:
    """The keyword arguments of ``family``'s transformers config class for ``spec``."""
    fields = asdict(spec)
    experts, top_k = fields.pop("num_experts"), fields.pop("num_experts_per_tok")
    if family not in BY_NAME:
        raise ModelError(f"unknown model family {family!r}; choose one of {list(FAMILY_NAMES)}")
    if BY_NAME[family].moe != (experts > 0):
        raise ModelError(f"family {family!r} with num_experts={experts}: Mixture-of-Experts presets (e.g. 'nano-moe') "
                         f"go with the families {', '.join(MOE_FAMILIES)}, dense presets with the others")
    common = dict(fields, bos_token_id=1, eos_token_id=2, pad_token_id=0, head_dim=spec.head_dim)
    common["rope_parameters"] = {"rope_type": "default", "rope_theta": common.pop("rope_theta")}
    router = dict(num_experts_per_tok=top_k, router_aux_loss_coef=0.0, output_router_logits=False)
    qwen_moe = dict(router, num_experts=experts, moe_intermediate_size=spec.intermediate_size, decoder_sparse_step=1)
    if family == "mixtral":
        return dict(**common, **router, num_local_experts=experts)
    if family == "deepseek-v3":
        return deepseek_v3_fields(spec, common, experts, top_k)
    if family == "gpt-oss":
        return gpt_oss_fields(spec, common, experts, top_k)
    if family == "qwen2-moe":
        return dict(**common, **qwen_moe, norm_topk_prob=False,
                    shared_expert_intermediate_size=2 * spec.intermediate_size)
    if family == "qwen3-moe":
        return dict(**common, **qwen_moe, norm_topk_prob=True)
    if family == "llama3":  # Llama 3.1's scaling needs a context beyond its original 8192 positions
        common.update(max_position_embeddings=131072, rope_parameters=dict(common["rope_parameters"], **LLAMA3_ROPE))
    if family in ("llama", "llama3"):
        return dict(**common, attention_bias=False, mlp_bias=False)
    if family == "phi3":  # Phi-4-mini's partial RoPE (Phi-3's is whole): the knob that full-RoPE families lack
        common["rope_parameters"]["partial_rotary_factor"] = 0.75  # and Phi-3-mini-4k's binding window (2047 of 4096)
        return dict(**common, sliding_window=PRESET_WINDOW)
    if family == "smollm3":  # NoPE every 4th layer, as SmolLM3-3B; every 2nd in a 2- or 3-layer preset, so it has one
        return dict(**common, use_sliding_window=False, no_rope_layer_interval=min(4, spec.num_hidden_layers))
    if family == "olmo2":
        return dict(**common, attention_bias=False)
    if family == "gemma3":
        return dict(**gemma3_fields(spec, common))
    if family == "mistral":  # a window in every layer, as Mistral 7B v0.1 (4096 of 32k positions)
        return dict(**common, sliding_window=PRESET_WINDOW)
    return dict(**common, use_sliding_window=False)


def deepseek_v3_fields(spec: TinyModelSpec, common: dict, experts: int, top_k: int) -> dict:
    """DeepSeek-V3 as it is laid out, shrunk: latent attention (query latent 3/4 of the hidden size, key/value latent
    1/2, per head a no-RoPE part of ``spec.head_dim``, a RoPE part of half that, values of ``spec.head_dim``); the first
    layer dense (twice an expert's width), then routed experts with one shared expert, sigmoid scores with the
    score-correction bias, 2 groups of which 1 is chosen, the kept scores renormalised and scaled by 2.5. Plain RoPE
    (the released models' YaRN is refused). The RoPE part's size is what transformers writes as ``head_dim`` (and
    what the config's checks read, before the folder is made)."""
    return dict(common, head_dim=spec.head_dim // 2, num_key_value_heads=spec.num_attention_heads, n_routed_experts=experts,
                num_experts_per_tok=top_k, n_shared_experts=1, moe_intermediate_size=spec.intermediate_size,
                intermediate_size=2 * spec.intermediate_size, first_k_dense_replace=1, n_group=2, topk_group=1,
                routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=3 * spec.hidden_size // 4,
                kv_lora_rank=spec.hidden_size // 2, qk_nope_head_dim=spec.head_dim,
                qk_rope_head_dim=spec.head_dim // 2, v_head_dim=spec.head_dim, rope_interleave=True)


def gpt_oss_fields(spec: TinyModelSpec, common: dict, experts: int, top_k: int) -> dict:
    """GPT-OSS as gpt-oss-20b is laid out, shrunk: sliding-window and full layers alternating (window
    :data:`PRESET_WINDOW`), YaRN RoPE with its released settings (beta 32 / 1, no truncation) at factor 8 over an original
    context of 64 positions, biases on attention, router and experts, learnable sinks, the clamped SwiGLU (limit 7,
    alpha 1.702), softmax over the top-k router logits."""
    rope = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "truncate": False, "original_max_position_embeddings": 64}
    layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(spec.num_hidden_layers)]
    return dict(common, rope_parameters=rope, num_local_experts=experts, num_experts_per_tok=top_k,
                router_aux_loss_coef=0.0, output_router_logits=False, sliding_window=PRESET_WINDOW,
                layer_types=layer_types, attention_bias=True, swiglu_limit=7.0)


PRESET_WINDOW = 32  # the sliding window of the windowed presets: shorter than the tests' sequences, so it binds


def gemma3_fields(spec: TinyModelSpec, common: dict) -> dict:
    """Gemma 3 (text) as Gemma-3-1B is laid out: tied embeddings, GELU-tanh, local layers (RoPE base
    ``spec.rope_theta``, a sliding window) and every 6th layer global (RoPE base 1e6); every 2nd in a preset of fewer
    than 6 layers, so each has both kinds. ``query_pre_attn_scalar`` differs from ``head_dim`` (as Gemma 3 27B's does), so
    the softmax scale read from it is tested."""
    local = common.pop("rope_parameters")
    every = 6 if spec.num_hidden_layers >= 6 else 2
    layer_types = ["full_attention" if (i + 1) % every == 0 else "sliding_attention"
                   for i in range(spec.num_hidden_layers)]
    return dict(common, tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh", layer_types=layer_types,
                sliding_window=PRESET_WINDOW, query_pre_attn_scalar=2 * spec.head_dim,
                rope_parameters={"sliding_attention": local,
                                 "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0}})


def architecture_name(config) -> str:
    """The ``architectures`` entry transformers writes for a config object (``Qwen2MoeConfig`` ->
    ``Qwen2MoeForCausalLM``; ``Gemma3TextConfig`` -> ``Gemma3ForCausalLM``, from the family table)."""
    name = type(config).__name__
    return next((f.architecture for f in BY_NAME.values() if f.config_class == name), name.replace("Config", "ForCausalLM"))


def make_model(folder: str | Path, preset: str | TinyModelSpec = "tiny", family: ModelFamily = "llama", seed: int = 0,
               tokenizer: TokenizerKind = "char", **overrides) -> Path:
    """Create a random-init model folder and return its path.

    ``overrides`` replace fields of the preset (e.g. ``tie_word_embeddings=True``). ``tokenizer`` is ``"char"``
    (the quickstart's) or ``"bpe"`` (byte-level BPE with a ChatML template and two EOS ids,
    :mod:`rlkit.models.bpe`); the vocabulary grows to hold the tokenizer's ids.
    """
    import torch
    from transformers import AutoModelForCausalLM

    if isinstance(preset, str):
        if preset not in PRESETS:
            raise ModelError(f"unknown model preset {preset!r}; choose one of {sorted(PRESETS)}")
        preset = PRESETS[preset]
    spec = replace(preset, **overrides)
    spec = replace(spec, vocab_size=max(spec.vocab_size, tokenizer_vocab_size(tokenizer)))  # tokenizer hook
    check_head_dim(spec.head_dim)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(spec, family), dtype=torch.float32)
    _jitter_constant_tensors(model)
    model.save_pretrained(str(folder))
    save_tokenizer(folder, tokenizer)  # tokenizer hook: after save_pretrained (BPE rewrites generation_config)
    return folder


def _jitter_constant_tensors(model: torch.nn.Module, scale: float = 0.05) -> None:
    """HF initialises norms to 1 and biases to 0; offset them randomly so that no tensor is constant and a
    conversion that drops, swaps or mis-shards one of them shows up in a logits comparison."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("norm.weight", ".bias", "_bias", ".sinks")):  # GPT-OSS: experts' *_proj_bias, sinks
                param.add_(torch.randn_like(param) * scale)
        for name, buffer in model.named_buffers():  # DeepSeek-V3's score-correction bias (a buffer, zero at init)
            if name.endswith("e_score_correction_bias"):
                buffer.add_(torch.randn_like(buffer) * scale)


def read_hf_config(folder: str | Path, check_weights: bool = True) -> dict:
    """``config.json`` of a model folder, with errors that name the problem and the fix.

    With ``check_weights`` the safetensors headers are read too (see :mod:`rlkit.models.folder`), so a
    truncated file is reported here, before an engine starts, not from inside one.
    """
    folder = Path(folder)
    path = folder / "config.json"
    if not folder.is_dir():
        raise ModelError(f"model folder {str(folder)!r} does not exist. Fix: create one with "
                         f"`rlkit make-model {folder}` or point policy.model_name at an HF model folder.")
    if not path.is_file():
        raise ModelError(f"{str(folder)!r} has no config.json, so it is not an HF model folder.")
    config = read_json_object(path, "model config")
    if check_weights:
        check_weight_files(folder)
    archs = config.get("architectures") or []
    if family_of(archs) is None:
        raise ModelError(f"architecture {archs} in {str(folder)!r} is not supported by rlkit's Megatron policy; "
                         f"supported: {sorted(SUPPORTED_ARCHITECTURES)}.")
    return config


def count_parameters(folder: str | Path) -> int:
    """Number of parameters stored in a model folder's safetensors files (a tied head is stored, and counted,
    once), read from the files' headers without loading a tensor."""
    total = 0
    for file in Path(folder).glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as f:
            total += sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    return total
