"""Build the session's components from a validated run config (one place that maps config -> objects)."""

from __future__ import annotations

from pathlib import Path

from rlkit.config.run import RunConfig


def ensure_model(config: RunConfig) -> Path:
    """The model folder; created from ``policy.model_preset`` when it does not exist yet."""
    from rlkit.models import make_model, read_hf_config

    path = Path(config.policy.model_name)
    if not (path / "config.json").is_file() and config.policy.model_preset is not None:
        make_model(path, config.policy.model_preset, config.policy.model_family, seed=config.seed)
    read_hf_config(path)  # clear error if it is still missing or unsupported
    return path


def build_policy(config: RunConfig):
    """In-process Megatron or DTensor policy, or a Ray worker group of them when there are several ranks."""
    p = config.policy
    if p.num_workers > 1 or p.ray_address is not None:
        from rlkit.policy.workers import RayPolicyGroup

        return RayPolicyGroup(p, p.num_workers, seed=config.seed, ray_address=p.ray_address)
    if p.dtensor_cfg.enabled:
        from rlkit.policy.dtensor import DTensorPolicy

        return DTensorPolicy(p, seed=config.seed)
    from rlkit.policy.megatron.moe import make_megatron_policy

    return make_megatron_policy(p, seed=config.seed)  # MegatronPolicy, or its MoE subclass for an MoE model


def build_generator(config: RunConfig):
    p = config.policy
    max_len = p.generation.vllm_cfg.max_model_len or p.max_total_sequence_length
    if p.generation.backend == "vllm":
        try:
            from rlkit.generation.vllm import VllmGenerator
        except ImportError as e:  # pragma: no cover - the CPU profile installs vLLM
            raise ImportError(f"vLLM is not installed ({e}); set policy.generation.backend=hf to use "
                              "transformers' generate instead") from e
        if not p.generation.colocated.enabled:  # the engine in its own process, refit by broadcast
            from rlkit.generation.remote import RemoteGenerator

            return RemoteGenerator(p.model_name, p.generation, max_model_len=max_len, seed=config.seed,
                                   ray_address=p.ray_address)
        return VllmGenerator(p.model_name, p.generation, max_model_len=max_len, seed=config.seed)
    from rlkit.generation.hf import HFGenerator

    return HFGenerator(p.model_name, p.generation, max_model_len=max_len, seed=config.seed)


def build_weight_sync(config: RunConfig):
    """In-process hand-over for a colocated generator, a broadcast to its actor otherwise."""
    from rlkit.weight_sync import BroadcastWeightSync, ColocatedWeightSync

    g = config.policy.generation
    bucket_bytes = g.refit_bucket_size_mb * 1e6
    return ColocatedWeightSync(bucket_bytes) if g.colocated.enabled else BroadcastWeightSync(bucket_bytes)


def build_environment(config: RunConfig):
    from rlkit.envs import make_environment

    if config.env.name == "math":
        return make_environment("math", timeout_seconds=config.env.math_timeout_s)
    return make_environment(config.env.name)
