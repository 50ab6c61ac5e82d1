"""A batch trained on twice: a warning, since in a notebook it is almost always a cell run twice.

``Session.rollout()`` marks each batch with the step it is for (``Trajectories.rollout_step``, the steps the
session had completed). ``train()`` completes a step, so a second ``train()`` on the same batch, like a
``train()`` on any batch from an earlier step, repeats an update on samples drawn from older weights and
records it as a new step. Epochs over one batch belong inside one ``train()`` call (``grpo.num_epochs``).

Deliberate simplification: a warning, not an error, since reuse can be the point (an overfitting check, an
off-policy experiment); ``train(batch, allow_reuse=True)`` says so and silences it. Batches made outside a
session (``rollout_step`` None) are not checked.
"""

from __future__ import annotations

import warnings

from rlkit.trajectories import Trajectories


def warn_if_reused(batch: Trajectories, steps_done: int) -> None:
    """Warn when ``batch`` was drawn for a step before the current one (``steps_done`` steps completed)."""
    if batch.rollout_step is None or batch.rollout_step >= steps_done:
        return
    drawn, now = batch.rollout_step + 1, steps_done + 1
    warnings.warn(
        f"train() on a batch drawn for step {drawn}, but step {drawn} is over (a train() completed it) and the "
        f"session is at step {now}: this repeats an update on samples from older weights and records it as "
        f"step {now}. Take a new batch with session.rollout() (then score(), logprobs(), advantages()) or run "
        "session.step(); for several passes over one batch set grpo.num_epochs; pass allow_reuse=True if the "
        "reuse is deliberate", stacklevel=3)
