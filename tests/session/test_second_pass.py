"""A newcomer's second pass. Warm starts add up: ``sft(n)`` twice is ``sft(2n)`` once (the same rows, schedule
and optimizer moments), until an RL update hands the RL optimizer back; then a new warm start begins on the rows
after the last. A session recording over an earlier run's folder says so."""

import pytest
import torch

import rlkit
from tests.session.conftest import tiny_overrides


@pytest.fixture(scope="module")
def warm_session(tmp_path_factory):
    s = rlkit.Session.from_config("quickstart", tiny_overrides(tmp_path_factory.mktemp("warm"), **{
        "sft.batch_size": 8, "sft.warmup_steps": 4, "sft.lr": 1e-2}))
    yield s
    s.close()


def weights(session):
    return {name: t.clone() for name, t in session.policy.hf_state_dict().items()}


def test_two_warm_starts_are_one_twice_as_long(warm_session):
    s = warm_session
    first = s.sft(3, progress=False, refit=False).losses + s.sft(3, progress=False, refit=False).losses
    after_two = weights(s)
    s.reset()
    once = s.sft(6, progress=False, refit=False).losses
    assert first == once  # each step's loss: the same rows under the same weights, bit for bit
    after_one = weights(s)
    assert all(torch.equal(after_two[name], after_one[name]) for name in after_one)
    assert s.current.state.warm_start.steps == 6


def test_an_rl_update_ends_the_warm_start_and_the_next_begins_anew(warm_session):
    s = warm_session
    s.reset()
    s.sft(2, progress=False)
    warm = s.current.state.warm_start
    assert warm.optimizer_active and s.policy.optimizer.param_groups[0]["lr"] == pytest.approx(1e-2 * 3 / 4)  # the next step's: warm-up step 3 of 4
    s.step()  # the RL optimizer is back, fresh, before the update
    assert not warm.optimizer_active
    assert s.policy.optimizer.param_groups[0]["initial_lr"] == s.config.policy.optimizer.lr
    position = warm.sampler.state_dict()["position"]
    s.sft(1, progress=False)  # a new optimizer and warm-up, on the rows after the last ones
    assert warm.optimizer_active and warm.steps == 3 and warm.sampler.state_dict()["position"] == position + 8
    assert s.policy.optimizer.param_groups[0]["lr"] == pytest.approx(1e-2 * 2 / 4)


def test_recording_over_an_earlier_runs_folder_warns_how_to_keep_both(warm_session, tmp_path):
    folder = tmp_path / warm_session.config.name
    folder.mkdir()
    (folder / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')  # an earlier session of the same preset
    try:
        with pytest.warns(UserWarning, match=r"holds an earlier run's records .* they are replaced.*'name': 'my-run'"):
            assert warm_session.log_to(tmp_path) == folder
    finally:
        warm_session.stop_logging()
