"""Steps whose gradients are not finite: ``Session.run()`` skips one and goes on; ``rlkit train`` stops after
``grpo.max_consecutive_skipped_steps`` in a row, with its summary written and a one-line error.

The NaN comes from the loss (multiplied by NaN at chosen steps), a stand-in for an overflow; the policy's
refusal of the update, the run loop, the records and the command line are the real ones.
"""

import json

import pytest
import torch

import rlkit
from rlkit.algorithms import RLLoss
from rlkit.cli import main
from rlkit.envs import RewardFunctionEnvironment
from rlkit.errors import ConfigError
from tests.session.conftest import tiny_overrides, varied_reward


class NanLossAt:
    """The config's RLLoss, but NaN (so every gradient is NaN) at the chosen RL steps of ``session``."""

    def __init__(self, inner, steps):
        self.inner, self.steps, self.session = inner, set(steps), None

    @property
    def needs_reference(self):
        return self.inner.needs_reference

    def __call__(self, logprobs, batch, counts):
        loss, metrics = self.inner(logprobs, batch, counts)
        return (loss * float("nan") if self.session.step_count + 1 in self.steps else loss), metrics


def test_run_skips_a_step_with_non_finite_gradients_and_goes_on(tmp_path):
    cfg = rlkit.load_config("quickstart", tiny_overrides(tmp_path))
    loss = NanLossAt(RLLoss(cfg.loss_fn), steps={2})
    seen = []
    with rlkit.Session(cfg, env=RewardFunctionEnvironment(varied_reward), loss_fn=loss) as session:
        loss.session = session

        def record(metrics):
            seen.append((metrics, session.policy.hf_state_dict(), list(session.batch.prompts)))

        with pytest.warns(UserWarning, match=r"step 2 skipped \(gradient norm is nan; .*\); 1 skipped so far, "
                                             r"stopping after 3 in a row"):
            done = session.run(4, progress=False, on_step=record)
        assert session.policy.version == 3 and session.step_count == 4

    assert [m.step for m in done] == [1, 2, 3, 4] and [m for m, _, _ in seen] == done  # the listener saw it too
    skipped = done[1]
    assert skipped["train/skipped_steps"] == 1.0 and skipped.policy_version == 1
    assert "train/loss" not in skipped.values and "train/grad_norm" not in skipped.values
    assert skipped["rollout/reward_mean"] == pytest.approx(float(seen[1][0]["rollout/reward_mean"]))
    assert all("train/skipped_steps" not in m.values for m in (done[0], done[2], done[3]))
    weights = [w for _, w, _ in seen]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])  # nothing applied at step 2
    assert not all(torch.equal(weights[1][k], weights[2][k]) for k in weights[1])  # step 3 learns
    prompts = [p for _, _, p in seen]
    assert prompts[2] != prompts[1]  # step 2's prompts were consumed


def test_rlkit_train_stops_after_too_many_skipped_steps_and_still_writes_its_summary(tmp_path, monkeypatch, capsys):
    original = RLLoss.__call__

    def nan_loss(self, logprobs, batch, counts):  # NaN on every step: a loss broken for good
        loss, metrics = original(self, logprobs, batch, counts)
        return loss * float("nan"), metrics

    monkeypatch.setattr(RLLoss, "__call__", nan_loss)
    overrides = [f"{k}={v}" for k, v in tiny_overrides(tmp_path).items()]
    with pytest.warns(UserWarning, match="skipped"):
        code = main(["train", "quickstart", *overrides, "name=nan", "grpo.max_num_steps=5",
                     "grpo.max_consecutive_skipped_steps=2", "--quiet"])
    assert code == 2
    err = capsys.readouterr().err
    assert ("rlkit: error: 2 RL steps in a row (steps 1-2) were skipped because their gradients were "
                          "not finite, the limit grpo.max_consecutive_skipped_steps=2; the last: gradient norm is nan") in err
    run_dir = tmp_path / "runs" / "nan"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped_early"].startswith("2 RL steps in a row")
    assert summary["rl_steps"] == summary["skipped_steps"] == 2
    assert summary["accuracy_after_rl"] == summary["accuracy_before_rl"]  # no update was applied
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(line["step"], line.get("train/skipped_steps")) for line in lines] == [(0, None), (1, 1.0), (2, 2.0), (2, None)]


def test_the_limit_is_validated():
    assert rlkit.load_config("quickstart").grpo.max_consecutive_skipped_steps == 3
    with pytest.raises(ConfigError, match=r"grpo\.max_consecutive_skipped_steps"):
        rlkit.load_config("quickstart", ["grpo.max_consecutive_skipped_steps=0"])
