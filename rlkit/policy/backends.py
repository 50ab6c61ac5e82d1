"""The training backends: the one place that maps the backend a config names to the code that runs it.

A backend is three pieces, none of which any other module branches on:

- its config section in :mod:`rlkit.config.backends` (a ``BackendSection`` field of ``PolicyConfig``, listed in
  ``BACKEND_SECTIONS``): its settings ``policy.<name>_cfg``, chosen by ``policy.backend=<name>``; its validation
  and layout rules, its memory-plan facts, its words for the start line and the session card. Config
  validation and the memory plan read them without importing a backend (``PolicyConfig.backend_section``);
- its module under ``rlkit/policy/``: a model adapter (:class:`rlkit.policy.adapter.ModelAdapter`) that states its
  rank facts (``dp_rank``, ``dp_size``, ``leader``: what a Ray worker reports) and, where the backend keeps RNG
  state of its own, registers it with :mod:`rlkit.rng` when imported (Megatron's tracker);
- its line in :data:`BACKENDS`: how to build the adapter in this process from a ``PolicyConfig`` and a seed; the
  training loop around it (:class:`rlkit.policy.in_process.InProcessPolicy`) is the same for every backend.

A Ray worker group (:mod:`rlkit.policy.workers`) builds the same entry in each of its ranks.
"""

from __future__ import annotations

from typing import Callable

from rlkit.config.components import PolicyConfig
from rlkit.errors import ConfigError
from rlkit.models.factory import read_hf_config
from rlkit.policy.adapter import ModelAdapter
from rlkit.policy.in_process import InProcessPolicy


def _megatron(cfg: PolicyConfig, seed: int) -> ModelAdapter:
    """Megatron-Core; its Mixture-of-Experts adapter for an MoE model folder."""
    from rlkit.policy.megatron.moe import MegatronMoEAdapter, is_moe
    from rlkit.policy.megatron.policy import MegatronAdapter

    return (MegatronMoEAdapter if is_moe(read_hf_config(cfg.model_name)) else MegatronAdapter)(cfg, seed)


def _dtensor(cfg: PolicyConfig, seed: int) -> ModelAdapter:
    from rlkit.policy.dtensor import DTensorAdapter

    return DTensorAdapter(cfg, seed)


def _hf(cfg: PolicyConfig, seed: int) -> ModelAdapter:
    from rlkit.policy.hf import HFAdapter

    return HFAdapter(cfg, seed)


BACKENDS: dict[str, Callable[[PolicyConfig, int], ModelAdapter]] = {
    "megatron": _megatron,
    "dtensor": _dtensor,
    "hf": _hf,
}


def in_process_policy(cfg: PolicyConfig, seed: int = 0) -> InProcessPolicy:
    """The policy of ``cfg``'s backend (``cfg.backend``), built in this process; with
    ``cfg.return_freed_host_memory`` freed host memory leaves this process from now on
    (:mod:`rlkit.host_memory`)."""
    if cfg.return_freed_host_memory:
        from rlkit.host_memory import return_freed_memory_to_os

        return_freed_memory_to_os()
    problems = cfg.backend_problems()  # (a model_copy that set NeMo-RL's flags instead of policy.backend)
    if problems:
        raise ConfigError(problems)
    return InProcessPolicy(BACKENDS[cfg.backend](cfg, seed))
