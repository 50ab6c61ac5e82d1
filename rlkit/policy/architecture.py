"""What every backend reads from an HF model folder: its :class:`Architecture` and its weights.

Backend-neutral: the Megatron model and weight conversion, the DTensor and transformers backends, and the
Ray worker group's description all read the same facts. Refused with the reason (never silently ignored):
RoPE scaling types other than llama3 (YaRN, linear, dynamic), llama3 scaling with other low/high frequency
factors or original context than Megatron-Core applies (1, 4, 8192: those of Llama 3.1 and 3.2),
sliding-window attention where the window is shorter than the model's context.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from torch import Tensor

from rlkit.errors import ModelError
from rlkit.models.factory import LLAMA3_ROPE, read_hf_config
from rlkit.models.families import family_of


def load_hf_state(folder: str | Path) -> Mapping[str, Tensor]:
    """The tensors of an HF model folder's safetensors files (one or several shards), read lazily."""
    from rlkit.models.safetensors_folder import SafetensorsFolder

    return SafetensorsFolder(folder)


@dataclass(frozen=True)
class Architecture:
    """The facts of an HF decoder config that the backends and the weight conversion need."""

    family: str  # a name of rlkit.models.families (e.g. "qwen2-moe")
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_layernorm: bool = False  # Qwen3: RMSNorm over each query and key head before RoPE
    rope_scaling_factor: float | None = None  # Llama 3.x: the factor of its "llama3" frequency scaling
    rotary_percent: float = 1.0  # the share of each head's dims RoPE turns (Phi-4-mini: 0.75, partial_rotary_factor)
    fused_projections: bool = False  # Phi-3: the checkpoint stores qkv_proj and gate_up_proj fused
    post_norms: bool = False  # OLMo 2: norms after attention and the MLP (none before); q/k norms over the projection
    no_rope_layers: tuple[int, ...] | None = None  # SmolLM3: 1 for each layer without RoPE (Megatron's no_rope_freq)

    @classmethod
    def from_hf_folder(cls, folder: str | Path) -> "Architecture":
        return cls.from_hf_config(read_hf_config(folder))

    @classmethod
    def from_hf_config(cls, cfg: dict) -> "Architecture":
        family = family_of(cfg["architectures"])
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        _refuse_a_binding_sliding_window(cfg)
        heads = cfg["num_attention_heads"]
        return cls(
            family=family.name,
            hidden_size=cfg["hidden_size"],
            num_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            ffn_hidden_size=cfg["intermediate_size"],
            vocab_size=cfg["vocab_size"],
            max_position_embeddings=cfg["max_position_embeddings"],
            rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
            rms_norm_eps=cfg["rms_norm_eps"],
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=family.qkv_bias or bool(cfg.get("attention_bias", False)),
            qk_layernorm=family.qk_norm,
            rope_scaling_factor=_llama3_rope_factor(rope),
            rotary_percent=float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))),
            fused_projections=family.fused_projections,
            post_norms=family.post_norms,
            no_rope_layers=_no_rope_layers(cfg),
        )


def _no_rope_layers(cfg: dict) -> tuple[int, ...] | None:
    """SmolLM3's ``no_rope_layers`` (1: the layer applies RoPE, 0: it does not) as Megatron's ``no_rope_freq``
    (1: the layer skips RoPE); None when every layer applies it."""
    uses_rope = cfg.get("no_rope_layers")
    if not uses_rope or all(uses_rope):
        return None
    if len(uses_rope) != cfg["num_hidden_layers"]:
        raise ModelError(f"no_rope_layers has {len(uses_rope)} entries for {cfg['num_hidden_layers']} layers")
    return tuple(0 if rope else 1 for rope in uses_rope)


def _refuse_a_binding_sliding_window(cfg: dict) -> None:
    """rlkit's Megatron model attends to the whole sequence. A window is harmless where it never binds: Qwen's
    ``use_sliding_window: false``, or a window (Mistral's, Phi-3's ``sliding_window``, applied by transformers
    whenever set) at least as long as the model's context."""
    if cfg.get("use_sliding_window"):
        raise ModelError("sliding-window attention (use_sliding_window: true) is not supported; rlkit's Megatron "
                         "model attends to the whole sequence")
    # Qwen-style configs carry a window that applies only with use_sliding_window
    window = None if "use_sliding_window" in cfg else cfg.get("sliding_window")
    if window is not None and window < cfg["max_position_embeddings"]:
        raise ModelError(f"sliding-window attention (sliding_window: {window}, shorter than max_position_embeddings: "
                         f"{cfg['max_position_embeddings']}) is not supported; rlkit's Megatron model attends to the "
                         "whole sequence. Fix: a model whose sliding_window is null or covers its whole context")


def _llama3_rope_factor(rope: dict) -> float | None:
    """The factor of Llama 3.x's RoPE scaling (None for plain RoPE); other scalings are refused."""
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type in ("default", None):
        return None
    if rope_type != "llama3":
        raise ModelError(f"RoPE scaling type {rope_type!r} is not supported: Megatron-Core's GPT model offers plain "
                         "RoPE and Llama 3's 'llama3' scaling. Use a model with one of those.")
    fixed = {k: v for k, v in LLAMA3_ROPE.items() if k not in ("rope_type", "factor")}
    differ = {k: rope.get(k) for k, v in fixed.items() if float(rope.get(k, v)) != v}
    if differ:
        raise ModelError(f"llama3 RoPE scaling with {differ} is not supported: Megatron-Core applies it with {fixed} "
                         "(the values of Llama 3.1 and 3.2)")
    return float(rope["factor"])
