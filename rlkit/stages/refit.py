"""Refit stage: push the policy's weights into the generator (see :mod:`rlkit.weight_sync`).

Colocated with an engine that sleeps between rollouts (``generator.sleeps_between_rollouts``: vLLM in this
process on a GPU), the refit is where the policy's optimizer state stops being needed until the next train
step, so it is offloaded to host memory first, before the engine wakes for the new weights: the engine then
has that memory while it loads and generates, and the policy brings the state back by itself at its next
train step. NeMo-RL's colocated refit does the same (``offload_before_refit``) with no config key; so does
rlkit. Anywhere else (an engine that stays awake, one in another process, a policy on the CPU) nothing moves.

On the CPU, where the engine frees its weights for each train step instead of sleeping
(``vllm_cfg.release_weights_for_training``), the policy frees its gradient buffers here in turn (the optimizer state has
nowhere to go), and reallocates them at its next step.

With adapters and ``policy.lora_cfg.release_base_while_generating`` the policy frees its frozen base before the
export, which reads it back from the model folder one layer at a time beside the engine's reload and leaves it
released for the rollout; the next forward pass reads it back whole.
"""

from __future__ import annotations

from rlkit.generation.base import Generator
from rlkit.policy.base import Policy
from rlkit.weight_sync import ColocatedWeightSync, RefitReport, WeightSync


def refit(policy: Policy, generator: Generator, sync: WeightSync | None = None) -> RefitReport:
    if getattr(generator, "sleeps_between_rollouts", False):  # (only vLLM's generator can sleep)
        policy.offload_optimizer_state()
    elif getattr(generator, "releases_weights_for_training", False) and hasattr(policy, "release_gradient_buffers"):
        policy.release_gradient_buffers()  # (the CPU's stand-in: the state has nowhere to go, the buffers can go)
    if getattr(policy, "releases_base_while_generating", False):  # (policy.lora_cfg)
        policy.release_frozen_base()  # the export reads it back a layer at a time, and leaves it released
    return (sync or ColocatedWeightSync()).sync(policy, generator)
