"""The training backends: the one place that maps the backend a config names to the code that runs it.

A backend is three pieces, none of which any other module branches on:

- its config section in :mod:`rlkit.config.components` (a ``BackendSection`` field of ``PolicyConfig``, listed in
  ``BACKEND_SECTIONS``): its settings ``policy.<name>_cfg``, chosen by ``policy.backend=<name>``; its validation
  and layout rules, its memory-plan facts, its words for the start line and the session card. Config
  validation and the memory plan read them without importing a backend (``PolicyConfig.backend_section``);
- its module under ``rlkit/policy/``: a policy on :class:`rlkit.policy.in_process.InProcessPolicy` that states its
  rank facts (``dp_rank``, ``dp_size``, ``leader``: what a Ray worker reports) and, where the backend keeps RNG
  state of its own, registers it with :mod:`rlkit.rng` when imported (Megatron's tracker);
- its line in :data:`BACKENDS`: how to build it in this process from a ``PolicyConfig`` and a seed.

A Ray worker group (:mod:`rlkit.policy.workers`) builds the same entry in each of its ranks.
"""

from __future__ import annotations

from typing import Callable

from rlkit.config.components import PolicyConfig
from rlkit.errors import ConfigError
from rlkit.models.factory import read_hf_config
from rlkit.policy.in_process import InProcessPolicy


def _megatron(cfg: PolicyConfig, seed: int) -> InProcessPolicy:
    """Megatron-Core; its Mixture-of-Experts subclass for an MoE model folder."""
    from rlkit.policy.megatron.moe import MegatronMoEPolicy, is_moe
    from rlkit.policy.megatron.policy import MegatronPolicy

    return (MegatronMoEPolicy if is_moe(read_hf_config(cfg.model_name)) else MegatronPolicy)(cfg, seed)


def _dtensor(cfg: PolicyConfig, seed: int) -> InProcessPolicy:
    from rlkit.policy.dtensor import DTensorPolicy

    return DTensorPolicy(cfg, seed)


def _hf(cfg: PolicyConfig, seed: int) -> InProcessPolicy:
    from rlkit.policy.hf import HFPolicy

    return HFPolicy(cfg, seed)


BACKENDS: dict[str, Callable[[PolicyConfig, int], InProcessPolicy]] = {
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
    return BACKENDS[cfg.backend](cfg, seed)
