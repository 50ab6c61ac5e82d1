"""Per-step metrics under NeMo-RL-style names (``rollout/...``, ``train/...``, ``timing/...``).

Everything measured by the wall clock (seconds per stage, samples and tokens per second) is under ``timing/``,
so the other groups are exactly reproducible from a checkpoint and a seed.

With dynamic sampling the ``rollout/`` figures computed here are the kept groups' (the batch trained on), chosen
for their reward variance; the learning curve is ``rollout/reward_mean_all_sampled``, the mean reward over every
sample of the step's rounds, kept and dropped, beside ``dynamic_sampling/kept_fraction`` (kept groups / sampled
groups): see :mod:`rlkit.stages.dynamic_sampling`, which measures both."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from rlkit.notebook.display import metrics_html, metrics_summary
from rlkit.trajectories import Trajectories


@dataclass
class StepMetrics:
    """One RL step's metrics by NeMo-RL-style name (``metrics["rollout/reward_mean"]``); see the module docstring.

    Mutable on purpose: it enters ``session.history`` when the update takes effect (an interrupt then keeps
    it), and the step completes that record in place (``step()``'s timings, ``run()``'s validation accuracy
    and the last step's listener seconds); copies would leave history and the caller with different records."""

    step: int  # RL steps completed, this one included
    policy_version: int  # optimizer steps the policy has taken after this step
    values: dict[str, float] = field(default_factory=dict)
    # the step's batch while the session's rollout history keeps it (rlkit.run.history), else None
    batch: Optional[Trajectories] = field(default=None, repr=False, compare=False)

    def __getitem__(self, key: str) -> float:
        return self.values[key]

    def get(self, key: str, default: float | None = None) -> float | None:
        """The metric ``key``, or ``default`` when this step did not record it."""
        return self.values.get(key, default)

    __repr__, _repr_html_ = metrics_summary, metrics_html


def rollout_metrics(batch: Trajectories) -> dict[str, float]:
    rewards = batch.require("rewards", "score()")
    lengths = batch.completion_lengths.float()
    return {
        "rollout/reward_mean": float(rewards.mean()),
        "rollout/reward_std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
        "rollout/gen_length_mean": float(lengths.mean()),
        "rollout/gen_length_max": float(lengths.max()),
        "rollout/truncation_rate": float(batch.truncated.float().mean()),
        "rollout/zero_variance_groups": float(batch.info.get("zero_variance_groups", 0.0)),
        "rollout/reward_errors": float(len(batch.reward_errors)),
        "rollout/policy_lag": 0.0,
        **reward_component_metrics(batch),
    }


def reward_component_metrics(batch: Trajectories) -> dict[str, float]:
    """``rollout/reward/<name>_mean`` of each weighted reward component (``env.rewards``, an environment's
    ``reward_components`` metadata), over the samples that report it."""
    seen: dict[str, list[float]] = {}
    for meta in batch.env_metadata or ():
        for name, value in (meta or {}).get("reward_components", {}).items():
            seen.setdefault(name, []).append(float(value))
    return {f"rollout/reward/{name}_mean": sum(v) / len(v) for name, v in seen.items()}


def step_metrics(step: int, policy_version: int, batch: Trajectories, train_metrics: dict[str, float],
                 timings: dict[str, float], version_before_train: int) -> StepMetrics:
    """The batch's rollout metrics and ``timing/`` entries, ``train_metrics`` under ``train/``, and ``timings``
    (seconds) over the batch's; ``version_before_train - batch.policy_version`` is how many updates behind
    the samples were."""
    values = rollout_metrics(batch)
    values["rollout/policy_lag"] = float(version_before_train - batch.policy_version)
    values.update({f"train/{k}": v for k, v in train_metrics.items()})
    values["train/token_mult_prob_error"] = float(batch.info.get("token_mult_prob_error", 1.0))
    values.update({k: v for k, v in batch.info.items() if k.startswith("timing/")})
    values.update({f"timing/{k.removeprefix('timing/')}": v for k, v in timings.items()})
    return StepMetrics(step, policy_version, values)
