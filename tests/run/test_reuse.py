"""warn_if_reused on hand-made batches: which step a batch was drawn for against the steps completed."""

import warnings

import pytest

from rlkit.run.reuse import warn_if_reused
from tests.helpers import random_batch


def reuse_warnings(batch, steps_done) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_if_reused(batch, steps_done)
    return [str(w.message) for w in caught]


@pytest.mark.parametrize("rollout_step, steps_done", [(None, 5), (3, 3), (0, 0)])
def test_a_batch_of_the_current_step_or_from_outside_a_session_is_quiet(rollout_step, steps_done):
    assert reuse_warnings(random_batch().with_(rollout_step=rollout_step), steps_done) == []


@pytest.mark.parametrize("rollout_step, steps_done, drawn, now", [(0, 1, 1, 2), (1, 4, 2, 5)])
def test_a_batch_of_an_earlier_step_warns_naming_both_steps_and_the_fix(rollout_step, steps_done, drawn, now):
    [message] = reuse_warnings(random_batch().with_(rollout_step=rollout_step), steps_done)
    assert message.startswith(f"train() on a batch drawn for step {drawn}, but step {drawn} is over")
    assert f"the session is at step {now}" in message and f"records it as step {now}" in message
    assert "session.rollout()" in message and "grpo.num_epochs" in message and "allow_reuse=True" in message
