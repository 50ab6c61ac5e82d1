"""The generation engines: the one place that maps ``policy.generation.backend`` to the code that runs it in this
process. What config knows of each engine (its words, what it reads, whether it can run in its own Ray actor) is
its record in :mod:`rlkit.config.engines`; an engine in its own actor is vLLM in
:class:`rlkit.generation.remote.RemoteGenerator`, which validation allows only where that record says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from rlkit.config.components import GenerationConfig
from rlkit.generation.base import Generator


def _vllm(model_path: str | Path, cfg: GenerationConfig, max_model_len: int, seed: int,
          policy: Optional[Any] = None) -> Generator:
    try:
        from rlkit.generation.vllm import VllmGenerator
    except ImportError as e:  # pragma: no cover - the CPU profile installs vLLM
        raise ImportError(f"vLLM is not installed ({e}); set policy.generation.backend=hf to use "
                          "transformers' generate instead") from e
    return VllmGenerator(model_path, cfg, max_model_len=max_model_len, seed=seed)


def _hf(model_path: str | Path, cfg: GenerationConfig, max_model_len: int, seed: int,
        policy: Optional[Any] = None) -> Generator:
    from rlkit.generation.hf import HFGenerator

    return HFGenerator(model_path, cfg, max_model_len=max_model_len, seed=seed)


def _megatron(model_path: str | Path, cfg: GenerationConfig, max_model_len: int, seed: int,
              policy: Optional[Any]) -> Generator:
    if policy is None:
        raise ValueError("policy.generation.backend=megatron samples from the policy's own model: build it with the "
                         "policy (rlkit.builders.build_generation)")
    return policy.own_generator(cfg, max_model_len, seed)


# model folder, generation config, max model length, seed, the policy (read by an engine on its own weights only)
ENGINES: dict[str, Callable[[str | Path, GenerationConfig, int, int, Optional[Any]], Generator]] = {
    "vllm": _vllm,
    "hf": _hf,
    "megatron": _megatron,
}


def in_process_generator(model_path: str | Path, cfg: GenerationConfig, max_model_len: int,
                         seed: int = 0, policy: Optional[Any] = None) -> Generator:
    """The engine ``cfg.backend`` names, in this process, on the model folder ``model_path`` (or, for an engine on
    the policy's own weights, on ``policy``'s model)."""
    return ENGINES[cfg.backend](model_path, cfg, max_model_len, seed, policy)
