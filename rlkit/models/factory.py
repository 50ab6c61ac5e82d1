"""Tiny HF-format models, made offline, that transformers, vLLM and the Megatron policy all load.

No model hub is reachable from our machines, so rlkit makes its own models: random-init Llama or Qwen2
(QKV bias) decoders with the character tokenizer of :mod:`rlkit.models.tokenizer`. A folder holds
``config.json``, ``model.safetensors`` and the tokenizer files with a chat template.

Every preset uses a ``head_dim`` that vLLM's CPU attention kernels accept (see :data:`VLLM_CPU_HEAD_DIMS`)
and a vocabulary padded to a multiple of 128 (the tokenizer has 103 tokens; the padding rows are never
sampled by a trained model and make the vocabulary divisible by any tensor-parallel size up to 128).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

import torch

from rlkit.errors import ModelError
from rlkit.models.folder import check_weight_files, read_json_object
from rlkit.models.tokenizer import save_char_tokenizer

ModelFamily = Literal["llama", "qwen2", "mixtral"]
SUPPORTED_ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "MixtralForCausalLM": "mixtral"}
VLLM_CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


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
    num_experts: int = 0  # > 0: a Mixture-of-Experts model (family "mixtral"); intermediate_size is per expert
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


def check_head_dim(head_dim: int) -> None:
    """vLLM's CPU attention fails at the first generate on other head sizes; say so before it starts."""
    if head_dim not in VLLM_CPU_HEAD_DIMS:
        raise ModelError(
            f"head_dim={head_dim} is not supported by vLLM's CPU attention kernels "
            f"(supported: {', '.join(map(str, VLLM_CPU_HEAD_DIMS))}). Fix: choose hidden_size and "
            f"num_attention_heads so that hidden_size / num_attention_heads is one of those."
        )


def hf_config(spec: TinyModelSpec, family: ModelFamily):
    """A transformers config object for ``spec`` in ``family``."""
    from transformers import LlamaConfig, MixtralConfig, Qwen2Config

    fields = asdict(spec)
    experts, top_k = fields.pop("num_experts"), fields.pop("num_experts_per_tok")
    if (family == "mixtral") != (experts > 0):
        raise ModelError(f"family {family!r} with num_experts={experts}: Mixture-of-Experts presets (e.g. 'nano-moe') "
                         "go with family 'mixtral', dense presets with 'llama' or 'qwen2'")
    common = dict(fields, bos_token_id=1, eos_token_id=2, pad_token_id=0, head_dim=spec.head_dim)
    if family == "mixtral":  # no load-balancing loss: the setting recommended for RL
        return MixtralConfig(**common, num_local_experts=experts, num_experts_per_tok=top_k,
                             router_aux_loss_coef=0.0, output_router_logits=False)
    if family == "llama":
        return LlamaConfig(**common, attention_bias=False, mlp_bias=False)
    if family == "qwen2":
        return Qwen2Config(**common, use_sliding_window=False)
    raise ModelError(f"unknown model family {family!r}; choose one of {sorted(SUPPORTED_ARCHITECTURES.values())}")


def make_model(
    folder: str | Path,
    preset: str | TinyModelSpec = "tiny",
    family: ModelFamily = "llama",
    seed: int = 0,
    **overrides,
) -> Path:
    """Create a random-init model folder and return its path.

    ``overrides`` replace fields of the preset (e.g. ``tie_word_embeddings=True``).
    """
    from transformers import AutoModelForCausalLM

    if isinstance(preset, str):
        if preset not in PRESETS:
            raise ModelError(f"unknown model preset {preset!r}; choose one of {sorted(PRESETS)}")
        preset = PRESETS[preset]
    spec = replace(preset, **overrides)
    check_head_dim(spec.head_dim)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(spec, family), dtype=torch.float32)
    _jitter_constant_tensors(model)
    model.save_pretrained(str(folder))
    save_char_tokenizer(folder)
    return folder


def _jitter_constant_tensors(model: torch.nn.Module, scale: float = 0.05) -> None:
    """HF initialises norms to 1 and biases to 0; offset them randomly so that no tensor is constant and a
    conversion that drops, swaps or mis-shards one of them shows up in a logits comparison."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):
                param.add_(torch.randn_like(param) * scale)


def read_hf_config(folder: str | Path, check_weights: bool = True) -> dict:
    """``config.json`` of a model folder, with errors that name the problem and the fix.

    With ``check_weights`` the safetensors headers are read too (see :mod:`rlkit.models.folder`), so a
    truncated file is reported here, before an engine starts, not from inside one.
    """
    folder = Path(folder)
    path = folder / "config.json"
    if not folder.is_dir():
        raise ModelError(
            f"model folder {str(folder)!r} does not exist. Fix: create one with "
            f"`rlkit make-model {folder}` or point policy.model_name at an HF model folder."
        )
    if not path.is_file():
        raise ModelError(f"{str(folder)!r} has no config.json, so it is not an HF model folder.")
    config = read_json_object(path, "model config")
    if check_weights:
        check_weight_files(folder)
    archs = config.get("architectures") or []
    if not any(a in SUPPORTED_ARCHITECTURES for a in archs):
        raise ModelError(
            f"architecture {archs} in {str(folder)!r} is not supported by rlkit's Megatron policy; "
            f"supported: {sorted(SUPPORTED_ARCHITECTURES)}."
        )
    return config


def count_parameters(folder: str | Path) -> int:
    """Number of parameters stored in a model folder's safetensors files."""
    from safetensors.torch import load_file

    return sum(t.numel() for file in Path(folder).glob("*.safetensors") for t in load_file(str(file)).values())
