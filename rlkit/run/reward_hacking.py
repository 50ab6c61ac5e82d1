"""Reward going up while held-out accuracy goes down: the usual sign that the policy found a way to earn reward
without solving the task (a partial-credit reward gamed by long completions, a format check met with no answer).

``run()`` evaluates every ``grpo.val_period`` steps; after each evaluation :func:`reward_hacking` compares it with
the best earlier one. When held-out accuracy fell by more than ``eval.reward_hacking_drop`` (absolute) while the
training reward rose over the same steps, the step's metrics get ``warnings/reward_hacking = 1`` and a warning
names the figures; the dashboard's header shows it.

Deliberate simplifications: the reward compared is the mean over the steps since the previous evaluation against
the mean over the steps up to the best one (with dynamic sampling, over everything sampled: the kept groups' mean
is chosen for its variance); a run evaluated fewer than twice is never flagged.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from rlkit.run.metrics import StepMetrics

ACCURACY, FLAG = "validation/accuracy", "warnings/reward_hacking"
REWARDS = ("rollout/reward_mean_all_sampled", "rollout/reward_mean")  # the first a step has


def _reward(m: StepMetrics) -> float:
    return next((m.values[k] for k in REWARDS if k in m.values), math.nan)


def _mean_reward(steps: Sequence[StepMetrics]) -> float:
    values = [r for r in map(_reward, steps) if not math.isnan(r)]
    return sum(values) / len(values) if values else math.nan


def reward_hacking(history: Sequence[StepMetrics], drop: Optional[float]) -> Optional[str]:
    """The warning for ``history`` (oldest first, the latest step just evaluated), or None: held-out accuracy at
    the latest evaluation below the best earlier one by more than ``drop`` while the reward rose."""
    evaluated = [i for i, m in enumerate(history) if ACCURACY in m.values]
    if drop is None or len(evaluated) < 2 or evaluated[-1] != len(history) - 1:
        return None
    best = max(evaluated[:-1], key=lambda i: history[i].values[ACCURACY])
    before, now = history[best].values[ACCURACY], history[-1].values[ACCURACY]
    since = history[evaluated[-2] + 1:]
    reward_then, reward_now = _mean_reward(history[:best + 1][-len(since):]), _mean_reward(since)
    if before - now <= drop or not reward_now > reward_then:
        return None
    return (f"likely reward hacking: held-out accuracy fell from {before:.3f} (step {history[best].step}) to "
            f"{now:.3f} (step {history[-1].step}) while the training reward rose from {reward_then:.3f} to "
            f"{reward_now:.3f}: the policy earns reward without solving the task. Look at the latest samples "
            "(session.batch) and what the reward pays for; eval.reward_hacking_drop sets this threshold")
