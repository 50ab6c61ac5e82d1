"""What the loop over steps (:meth:`rlkit.run.run.Run.run`) shows and records besides the steps: the progress
bar's name and figures, and a skipped step (a step whose gradients are not finite is recorded and the run goes
on, :mod:`rlkit.run.skipped_steps`). Plain functions of their inputs; the loop itself is the Run's."""

from __future__ import annotations

import warnings
from typing import Any, Callable

from rlkit.algorithms import RLLoss
from rlkit.config.run import RunConfig
from rlkit.run.metrics import StepMetrics
from rlkit.run.skipped_steps import skipped_step_metrics
from rlkit.run.state import RunState

_NAMES = {"dr_grpo": "Dr. GRPO", "reinforce_pp": "REINFORCE++", "reinforce_baseline": "REINFORCE"}


def algorithm_name(loss_fn: Callable, config: RunConfig) -> str:
    """What the progress bar calls the run: the policy loss when it names an algorithm of its own (GSPO), else the
    advantage estimator (GRPO, RLOO, ...); "RL" for a loss function of yours."""
    if not isinstance(loss_fn, RLLoss):
        return "RL"
    loss = config.loss_fn.policy_loss
    if not isinstance(loss, str):  # a policy-loss function of yours
        return getattr(loss, "__name__", "RL")
    if loss != "ppo_clip":
        return _NAMES.get(loss, loss.upper())
    return _NAMES.get(config.grpo.advantage_estimator, config.grpo.advantage_estimator.upper())


def show_progress(bar: Any, metrics: StepMetrics, with_kl: bool) -> None:
    """The bar advanced by one step, with its reward and entropy (and KL where a reference pass measures it)."""
    shown = {"reward": f"{metrics['rollout/reward_mean']:.3f}",
             "entropy": f"{metrics.get('train/approx_entropy', float('nan')):.3f}"}
    if with_kl:
        shown["kl"] = f"{metrics.get('train/kl', 0.0):.4f}"
    bar.set_postfix(shown, refresh=False)
    bar.update(1)


def skipped(state: RunState, policy_version: int, version_before: int, seconds: float, error: BaseException,
            limit: int) -> StepMetrics:
    """Record the step whose update the policy refused as a skipped step in ``state``: its prompts are consumed, its
    metrics are its batch's rollout metrics and ``train/skipped_steps``; warns with the count and the ``limit``."""
    metrics = skipped_step_metrics(state.step + 1, policy_version, state.batch, version_before, seconds,
                                   state.history)
    state.end_step(metrics)
    warnings.warn(f"step {metrics.step} skipped ({error}); {metrics['train/skipped_steps']:.0f} skipped so far, "
                  f"stopping after {limit} in a row (grpo.max_consecutive_skipped_steps)", stacklevel=4)
    return metrics
