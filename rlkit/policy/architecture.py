"""What every backend reads from an HF model folder: its :class:`Architecture` and its weights.

Backend-neutral: the Megatron model and weight conversion, the DTensor and transformers backends, and the
Ray worker group's description all read the same facts. Refused with the reason (never silently ignored):
RoPE scaling types other than llama3 (YaRN except GPT-OSS's, linear, dynamic), llama3 scaling with other low/high frequency
factors or original context than Megatron-Core applies (1, 4, 8192: those of Llama 3.1 and 3.2),
Qwen-style ``use_sliding_window: true``, and Gemma 3 options it does not compute (logit soft-capping, bidirectional
attention, RoPE scaling of its global layers), DeepSeek-V3 with YaRN or other options its Megatron mapping lacks,
GPT-OSS with other activations, unbiased attention or YaRN's own mscale settings.

Sliding windows are computed (:mod:`rlkit.policy.megatron.sliding_window`): Gemma 3's local layers, and Mistral's and
Phi-3's ``sliding_window``, which transformers applies in every layer whenever it is set (a window covering the whole
context is dropped: it never binds), GPT-OSS's alternating sliding-window and full layers.
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
    gemma: bool = False  # Gemma 3: (1+w) RMSNorms, embeddings x sqrt(hidden), norms before and after attention and MLP
    activation: str = "silu"  # the gated MLP's activation: "silu" (SwiGLU) or "gelu_tanh" (Gemma's GeGLU)
    softmax_scale: float | None = None  # Gemma 3: query_pre_attn_scalar ** -0.5 (None: head_dim ** -0.5)
    sliding_window: int | None = None  # how many positions a local layer's token sees (itself included)
    local_layers: tuple[int, ...] | None = None  # 1 for each local (sliding-window) layer, 0 for a global one (Mistral,
    # Phi-3: every layer local)
    local_rope_theta: float | None = None  # Gemma 3: the local layers' RoPE base (rope_theta is the global layers')
    # DeepSeek-V3's multi-head latent attention (rlkit.policy.megatron.mla); kv_lora_rank 0: none
    kv_lora_rank: int = 0
    q_lora_rank: int | None = None  # None: queries projected whole (no query latent)
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # GPT-OSS (rlkit.policy.megatron.gpt_oss): biases on o_proj, the router and the experts; a learnable sink per head
    linear_bias: bool = False
    attention_sinks: bool = False
    yarn: tuple[float, int, float, float, bool] | None = None  # factor, original context, beta_fast, beta_slow, truncate
    swiglu_limit: float | None = None  # the clamped SwiGLU: gate <= limit, |up| <= limit, gate * sigmoid(alpha gate) (up + 1)
    swiglu_alpha: float = 1.702

    @classmethod
    def from_hf_folder(cls, folder: str | Path) -> "Architecture":
        return cls.from_hf_config(read_hf_config(folder))

    @classmethod
    def from_hf_config(cls, cfg: dict) -> "Architecture":
        family = family_of(cfg["architectures"])
        if family.gemma:
            return _gemma3(cls, cfg)
        if family.mla:
            return _deepseek_v3(cls, cfg)
        if family.gpt_oss:
            return _gpt_oss(cls, cfg)
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        window = _binding_sliding_window(cfg)
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
            sliding_window=window,
            local_layers=None if window is None else (1,) * cfg["num_hidden_layers"],
        )


def _gemma3(cls, cfg: dict) -> "Architecture":
    """Gemma 3 (text): its local layers attend within ``sliding_window`` positions with RoPE base ``rope_parameters.
    sliding_attention``, its global layers to the whole sequence with ``rope_parameters.full_attention``."""
    refused = {k: cfg.get(k) for k in ("final_logit_softcapping", "attn_logit_softcapping", "use_bidirectional_attention")
               if cfg.get(k)}
    if refused:
        raise ModelError(f"Gemma 3 with {refused} is not supported: rlkit's Megatron model computes neither logit "
                         "soft-capping (its fused head takes logprobs from the raw logits) nor bidirectional attention "
                         "(Gemma 3's released text checkpoints set none of these). Fix: a config with these null/false")
    if cfg.get("hidden_activation", "gelu_pytorch_tanh") not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ModelError(f"Gemma 3 with hidden_activation={cfg['hidden_activation']!r} is not supported (GELU-tanh is)")
    rope = cfg.get("rope_parameters") or {}
    thetas = {}
    for kind, default in (("full_attention", 1_000_000.0), ("sliding_attention", 10_000.0)):
        params = rope.get(kind) or {}
        if params.get("rope_type", "default") != "default":
            raise ModelError(f"Gemma 3 with RoPE scaling {params.get('rope_type')!r} on its {kind} layers is not "
                             "supported yet (Gemma-3-1B has none; the 4B-27B models' text towers scale their global "
                             "layers linearly). Fix: a config whose rope_parameters are rope_type 'default'")
        thetas[kind] = float(params.get("rope_theta", default))
    types = cfg.get("layer_types") or []
    if len(types) != cfg["num_hidden_layers"] or set(types) - {"full_attention", "sliding_attention"}:
        raise ModelError(f"Gemma 3's layer_types {types} must name full_attention or sliding_attention for each of "
                         f"its {cfg['num_hidden_layers']} layers")
    window = cfg.get("sliding_window")
    local = tuple(int(t == "sliding_attention") for t in types)
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    return cls(family="gemma3", hidden_size=cfg["hidden_size"], num_layers=cfg["num_hidden_layers"],
               num_attention_heads=heads, num_key_value_heads=cfg.get("num_key_value_heads") or heads,
               head_dim=head_dim, ffn_hidden_size=cfg["intermediate_size"], vocab_size=cfg["vocab_size"],
               max_position_embeddings=cfg["max_position_embeddings"], rope_theta=thetas["full_attention"],
               rms_norm_eps=cfg["rms_norm_eps"], tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
               qkv_bias=bool(cfg.get("attention_bias", False)), qk_layernorm=True, gemma=True, activation="gelu_tanh",
               softmax_scale=float(cfg.get("query_pre_attn_scalar", head_dim)) ** -0.5,
               sliding_window=None if window is None else int(window), local_layers=local,
               local_rope_theta=thetas["sliding_attention"])


def _deepseek_v3(cls, cfg: dict) -> "Architecture":
    """DeepSeek-V3's attention and dense facts (its experts: :class:`rlkit.policy.megatron.moe.MoEArchitecture`).
    ``head_dim`` is the query/key head size (no-RoPE + RoPE parts); ``ffn_hidden_size`` the dense layers' MLP."""
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
        raise ModelError(f"DeepSeek-V3 with RoPE scaling {rope.get('rope_type', rope.get('type'))!r} is not supported "
                         "yet (the released checkpoints use YaRN, which rlkit's Megatron MLA is not mapped to). Fix: a "
                         "config whose rope_parameters are rope_type 'default'")
    if not cfg.get("rope_interleave", True):
        raise ModelError("DeepSeek-V3 with rope_interleave: false is not supported: Megatron's MLA reads the RoPE "
                         "dims interleaved, as DeepSeek's checkpoints store them")
    if cfg.get("attention_bias") or cfg.get("hidden_act", "silu") != "silu":
        raise ModelError(f"DeepSeek-V3 with attention_bias={cfg.get('attention_bias')} / hidden_act="
                         f"{cfg.get('hidden_act')!r} is not supported (no bias, SiLU: the released models')")
    heads, nope, rope_dim = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"]
    return cls(family=family_of(cfg["architectures"]).name, hidden_size=cfg["hidden_size"],
               num_layers=cfg["num_hidden_layers"], num_attention_heads=heads, num_key_value_heads=heads,
               head_dim=nope + rope_dim, ffn_hidden_size=cfg["intermediate_size"], vocab_size=cfg["vocab_size"],
               max_position_embeddings=cfg["max_position_embeddings"],
               rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
               rms_norm_eps=cfg["rms_norm_eps"], tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
               qkv_bias=False, kv_lora_rank=cfg["kv_lora_rank"], q_lora_rank=cfg.get("q_lora_rank"),
               qk_nope_head_dim=nope, qk_rope_head_dim=rope_dim, v_head_dim=cfg["v_head_dim"])


def _gpt_oss(cls, cfg: dict) -> "Architecture":
    """GPT-OSS's attention and norms (its experts: :class:`rlkit.policy.megatron.moe.MoEArchitecture`): biases on every
    attention projection, a learnable sink logit per head, ``layer_types`` alternating sliding-window and full layers,
    YaRN RoPE (or plain), the experts' clamped SwiGLU. ``ffn_hidden_size`` is one expert's width."""
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "yarn"):
        raise ModelError(f"GPT-OSS with RoPE scaling {rope_type!r} is not supported (YaRN, the released models', and "
                         "plain RoPE are). Fix: rope_type 'yarn' or 'default'")
    if rope_type == "yarn" and (rope.get("mscale") or rope.get("mscale_all_dim") or rope.get("attention_factor")):
        raise ModelError("GPT-OSS with YaRN's mscale / mscale_all_dim / attention_factor set is not supported: rlkit "
                         "applies YaRN's default attention factor 0.1 ln(factor) + 1 (the released models'). Fix: "
                         "leave them unset")
    if cfg.get("hidden_act", "silu") != "silu" or not cfg.get("attention_bias", True):
        raise ModelError(f"GPT-OSS with hidden_act={cfg.get('hidden_act')!r} / attention_bias="
                         f"{cfg.get('attention_bias')} is not supported (the clamped SwiGLU and biased attention of the "
                         "released models are)")
    types = cfg.get("layer_types") or []
    if len(types) != cfg["num_hidden_layers"] or set(types) - {"full_attention", "sliding_attention"}:
        raise ModelError(f"GPT-OSS's layer_types {types} must name full_attention or sliding_attention for each of "
                         f"its {cfg['num_hidden_layers']} layers")
    window = cfg.get("sliding_window")
    local = tuple(int(t == "sliding_attention") for t in types) if window else None
    yarn = None
    if rope_type == "yarn":
        yarn = (float(rope["factor"]), int(rope["original_max_position_embeddings"]),
                float(rope.get("beta_fast") or 32.0), float(rope.get("beta_slow") or 1.0), bool(rope.get("truncate", True)))
    heads = cfg["num_attention_heads"]
    return cls(family=family_of(cfg["architectures"]).name, hidden_size=cfg["hidden_size"],
               num_layers=cfg["num_hidden_layers"], num_attention_heads=heads,
               num_key_value_heads=cfg.get("num_key_value_heads") or heads,
               head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads, ffn_hidden_size=cfg["intermediate_size"],
               vocab_size=cfg["vocab_size"], max_position_embeddings=cfg["max_position_embeddings"],
               rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 150000.0))),
               rms_norm_eps=cfg["rms_norm_eps"], tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
               qkv_bias=True, linear_bias=True, attention_sinks=True, activation="swiglu_clamped",
               sliding_window=int(window) if local and any(local) else None, local_layers=local, yarn=yarn,
               swiglu_limit=float(cfg.get("swiglu_limit", 7.0)), swiglu_alpha=float(cfg.get("swiglu_alpha", 1.702)))


def _no_rope_layers(cfg: dict) -> tuple[int, ...] | None:
    """SmolLM3's ``no_rope_layers`` (1: the layer applies RoPE, 0: it does not) as Megatron's ``no_rope_freq``
    (1: the layer skips RoPE); None when every layer applies it."""
    uses_rope = cfg.get("no_rope_layers")
    if not uses_rope or all(uses_rope):
        return None
    if len(uses_rope) != cfg["num_hidden_layers"]:
        raise ModelError(f"no_rope_layers has {len(uses_rope)} entries for {cfg['num_hidden_layers']} layers")
    return tuple(0 if rope else 1 for rope in uses_rope)


def _binding_sliding_window(cfg: dict) -> int | None:
    """The window every layer applies (Mistral's, Phi-3's ``sliding_window``: transformers applies it whenever set), or
    None where it never binds: none set, Qwen's ``use_sliding_window: false``, or a window at least as long as the
    model's context. Qwen-style ``use_sliding_window: true`` (a window on the layers past ``max_window_layers``) is
    refused."""
    if cfg.get("use_sliding_window"):
        raise ModelError("sliding-window attention (use_sliding_window: true) is not supported; rlkit's Megatron "
                         "model applies a window to every layer (Mistral's, Phi-3's) or to the layers a config's "
                         "layer_types name (Gemma 3's), not to the layers past Qwen's max_window_layers. Fix: "
                         "use_sliding_window: false")
    # Qwen-style configs carry a window that applies only with use_sliding_window
    window = None if "use_sliding_window" in cfg else cfg.get("sliding_window")
    if window is None or window >= cfg["max_position_embeddings"]:
        return None
    if window < 1:
        raise ModelError(f"sliding_window: {window} is not a window (at least 1 position). Fix: null for none")
    return int(window)


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
