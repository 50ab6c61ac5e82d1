"""Steps skipped for non-finite gradients: how ``Session.run()`` recognises one, records it, and when it stops.

Why: one overflow (a log-ratio spike, one bad batch) should not end a whole run, and the policy already
refuses such an update whole (weights and optimizer state unchanged, ``FloatingPointError``). So ``run()``
goes on: the step's prompts are consumed, nothing is applied, and the step is recorded like any other, with
the rollout metrics of its batch, no ``train/`` metrics, and ``train/skipped_steps``, the count of skipped
steps so far. Many in a row mean something is broken for good (diverged weights, a loss that is NaN on every
batch); after ``grpo.max_consecutive_skipped_steps`` of them ``run()`` raises :class:`SkippedStepsError`.

The count lives in the history (a skipped step is one whose metrics hold ``train/skipped_steps``), so a
resumed run counts on from its checkpoint.

Deliberate simplification: with several optimizer steps per RL step (``grpo.num_epochs`` > 1, or
``policy.train_global_batch_size`` below the rollout size), the updates before the refused one stay applied
(each is whole); the step still counts as skipped, and the generator is refit to the applied weights.
"""

from __future__ import annotations

import itertools
from typing import Optional, Sequence

from rlkit.errors import SkippedStepsError
from rlkit.run.metrics import StepMetrics, step_metrics
from rlkit.trajectories import Trajectories

SKIPPED = "train/skipped_steps"


def refused_update(error: BaseException) -> Optional[FloatingPointError]:
    """The policy's refusal of an update for non-finite gradients, if ``error`` is one: a ``FloatingPointError``
    raised in this process, or one a policy worker sent back as the cause of its error; else None."""
    return next((c for c in (error, getattr(error, "cause", None)) if isinstance(c, FloatingPointError)), None)


def skipped_so_far(history: Sequence[StepMetrics]) -> int:
    return sum(SKIPPED in m.values for m in history)


def skipped_in_a_row(history: Sequence[StepMetrics]) -> int:
    """Skipped steps at the end of ``history``."""
    return sum(1 for _ in itertools.takewhile(lambda m: SKIPPED in m.values, reversed(history)))


def skipped_step_metrics(step: int, policy_version: int, batch: Trajectories, version_before_train: int,
                         seconds: float, history: Sequence[StepMetrics]) -> StepMetrics:
    """The metrics of skipped step ``step`` (RL steps completed, this one included): its batch's rollout
    metrics, the step's wall time, and ``train/skipped_steps`` counting this one."""
    metrics = step_metrics(step, policy_version, batch, {}, {"step_total": seconds}, version_before_train)
    metrics.values[SKIPPED] = float(skipped_so_far(history) + 1)
    return metrics


def too_many_skipped(limit: int, history: Sequence[StepMetrics], last_error: BaseException) -> SkippedStepsError:
    n = skipped_in_a_row(history)
    return SkippedStepsError(
        f"{n} RL steps in a row (steps {history[-n].step}-{history[-1].step}) were skipped because their gradients "
        f"were not finite, the limit grpo.max_consecutive_skipped_steps={limit}; the last: {last_error}. The "
        "weights are those of the last applied update. Fix: look for NaN or inf in the loss and rewards "
        "(a custom loss or reward function), lower policy.optimizer.lr, or set policy.max_grad_norm; then "
        "resume from the last checkpoint (rlkit train ... --resume-from STEP)")
