"""The generation engines: the one place that maps ``policy.generation.backend`` to the code that runs it in this
process. What config knows of each engine (its words, what it reads, whether it can run in its own Ray actor) is
its record in :mod:`rlkit.config.engines`; an engine in its own actor is vLLM in
:class:`rlkit.generation.remote.RemoteGenerator`, which validation allows only where that record says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from rlkit.config.components import GenerationConfig
from rlkit.generation.base import Generator


def _vllm(model_path: str | Path, cfg: GenerationConfig, max_model_len: int, seed: int) -> Generator:
    try:
        from rlkit.generation.vllm import VllmGenerator
    except ImportError as e:  # pragma: no cover - the CPU profile installs vLLM
        raise ImportError(f"vLLM is not installed ({e}); set policy.generation.backend=hf to use "
                          "transformers' generate instead") from e
    return VllmGenerator(model_path, cfg, max_model_len=max_model_len, seed=seed)


def _hf(model_path: str | Path, cfg: GenerationConfig, max_model_len: int, seed: int) -> Generator:
    from rlkit.generation.hf import HFGenerator

    return HFGenerator(model_path, cfg, max_model_len=max_model_len, seed=seed)


ENGINES: dict[str, Callable[[str | Path, GenerationConfig, int, int], Generator]] = {
    "vllm": _vllm,
    "hf": _hf,
}


def in_process_generator(model_path: str | Path, cfg: GenerationConfig, max_model_len: int,
                         seed: int = 0) -> Generator:
    """The engine ``cfg.backend`` names, in this process, on the model folder ``model_path``."""
    return ENGINES[cfg.backend](model_path, cfg, max_model_len, seed)
