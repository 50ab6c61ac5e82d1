"""train() on a batch that was trained on already, or that an earlier step drew, warns; epochs do not.

Re-running a notebook cell that calls ``session.train(batch)`` used to take another optimizer step on the same
samples and record it as a new RL step, silently.
"""

import warnings

import pytest

REUSE = "train() on a batch drawn for step"


def prepared(session, batch=None):
    """A batch ready to train on: the session's rollout for this step (or ``batch``), scored, with advantages."""
    return session.advantages(session.logprobs(session.score(batch if batch is not None else session.rollout())))


def reuse_warnings(call) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [str(w.message) for w in caught if str(w.message).startswith(REUSE)]


def test_a_batch_trained_on_twice_warns_and_says_what_to_do(session):
    if session.stale:
        session.refit()
    batch = prepared(session)
    start = session.step_count
    assert batch.rollout_step == start
    assert reuse_warnings(lambda: session.train(batch)) == []
    [message] = reuse_warnings(lambda: session.train(batch))  # the cell run again
    assert message.startswith(f"{REUSE} {start + 1}, but step {start + 1} is over")
    assert f"the session is at step {start + 2}" in message and "session.rollout()" in message
    assert "allow_reuse=True" in message
    assert session.step_count == start + 2  # a warning, not a refusal: the reuse still trains
    assert reuse_warnings(lambda: session.train(batch, allow_reuse=True)) == []
    assert session.step_count == start + 3
    session.refit()


def test_a_batch_drawn_for_an_earlier_step_warns(session):
    if session.stale:
        session.refit()
    early = prepared(session)  # drawn, never trained on
    start = session.step_count
    session.step()  # the step ends with its own batch
    [message] = reuse_warnings(lambda: session.train(early))
    assert message.startswith(f"{REUSE} {start + 1}, but step {start + 1} is over")
    session.refit()


def test_chosen_prompts_are_marked_with_their_step_too(session):
    if session.stale:
        session.refit()
    rows = list(session.dataset["train"].select(range(2)))
    batch = prepared(session, session.rollout(rows=rows))
    assert batch.rollout_step == session.step_count
    session.train(batch)
    assert len(reuse_warnings(lambda: session.train(batch))) == 1
    session.refit()


def test_epochs_within_one_train_call_do_not_warn(session):
    if session.stale:
        session.refit()
    epochs = session.config.grpo.num_epochs
    session.configure(["grpo.num_epochs=2"])
    try:
        batch = prepared(session)
        version = session.policy.version
        assert reuse_warnings(lambda: session.train(batch)) == []
        assert session.policy.version >= version + 2  # two passes over the batch, each with its updates
    finally:
        session.configure([f"grpo.num_epochs={epochs}"])
    session.refit()
