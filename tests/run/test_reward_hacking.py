"""Reward up, held-out accuracy down: run() flags likely reward hacking (rlkit.run.reward_hacking)."""

import warnings

import pytest

import rlkit
from rlkit.run.metrics import StepMetrics
from rlkit.run.reward_hacking import reward_hacking
from tests.session.conftest import tiny_overrides


def steps(rewards, accuracies):
    """StepMetrics 1..n with these rewards, and held-out accuracy where ``accuracies`` has a value."""
    out = []
    for i, (r, a) in enumerate(zip(rewards, accuracies), start=1):
        values = {"rollout/reward_mean": r} | ({} if a is None else {"validation/accuracy": a})
        out.append(StepMetrics(i, i, values))
    return out


def test_accuracy_falling_past_the_drop_while_the_reward_rises_is_flagged():
    history = steps([0.2, 0.3, 0.5, 0.7], [None, 0.40, None, 0.25])
    message = reward_hacking(history, 0.1)
    assert "from 0.400 (step 2) to 0.250 (step 4)" in message and "from 0.250 to 0.600" in message


@pytest.mark.parametrize("rewards, accuracies, drop", [
    ([0.2, 0.3, 0.5, 0.7], [None, 0.40, None, 0.35], 0.1),  # accuracy fell, but by less than the drop
    ([0.7, 0.6, 0.4, 0.3], [None, 0.40, None, 0.20], 0.1),  # both fell: not learning, not hacking
    ([0.2, 0.3, 0.5, 0.7], [None, 0.40, None, 0.60], 0.1),  # both rose
    ([0.2, 0.3, 0.5, 0.7], [None, 0.40, None, 0.20], None),  # turned off
    ([0.2, 0.3, 0.5, 0.7], [None, None, None, 0.20], 0.1),  # one evaluation: nothing to compare
    ([0.2, 0.3, 0.5, 0.7], [None, 0.40, 0.20, None], 0.1),  # the latest step was not evaluated
])
def test_no_flag_otherwise(rewards, accuracies, drop):
    assert reward_hacking(steps(rewards, accuracies), drop) is None


def test_run_flags_it_in_the_step_metrics_and_the_dashboard(tmp_path, monkeypatch):
    """The wiring, with a reward that pays more at every call whatever the samples (gamed by construction) and the
    held-out accuracies stood in for (a mock: this is about what run() does with them, not about learning)."""
    calls = []

    def gameable(prompts, completions, **columns):
        calls.append(1)
        return [0.1 * len(calls)] * len(completions)

    s = rlkit.Session.from_config("quickstart", tiny_overrides(tmp_path, **{"grpo.val_period": 2}),
                                  env=rlkit.envs.RewardFunctionEnvironment(gameable))
    try:
        accuracies = iter([0.5, 0.2])
        monkeypatch.setattr(type(s.current), "evaluate", lambda self, *a, **k: type(
            "Eval", (), {"accuracy": next(accuracies)})())
        dashboard = s.dashboard()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            done = s.run(4, progress=False)
        assert [m.values.get("warnings/reward_hacking") for m in done] == [None, None, None, 1.0]
        assert any("likely reward hacking: held-out accuracy fell from 0.500 (step 2) to 0.200 (step 4)"
                   in str(w.message) for w in caught)
        assert "likely reward hacking" in dashboard.header_html() and "REWARD HACKING" in dashboard.text()
    finally:
        s.close()
