"""Which in-process backend a policy config asks for (one place; the session and each Ray worker use it)."""

from __future__ import annotations

from rlkit.config.components import PolicyConfig
from rlkit.policy.in_process import InProcessPolicy


def in_process_policy(cfg: PolicyConfig, seed: int = 0) -> InProcessPolicy:
    """The DTensor policy with ``policy.dtensor_cfg.enabled``, else the Megatron one (its Mixture-of-Experts
    subclass for an MoE model folder)."""
    if cfg.dtensor_cfg.enabled:
        from rlkit.policy.dtensor import DTensorPolicy

        return DTensorPolicy(cfg, seed)
    from rlkit.models.factory import read_hf_config
    from rlkit.policy.megatron.moe import MegatronMoEPolicy, is_moe
    from rlkit.policy.megatron.policy import MegatronPolicy

    return (MegatronMoEPolicy if is_moe(read_hf_config(cfg.model_name)) else MegatronPolicy)(cfg, seed)
