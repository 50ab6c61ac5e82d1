"""Dynamic sampling's learning curve through a real session: the reward over everything the step sampled (kept
and dropped groups) and the kept share reach the step's metrics and ``metrics.jsonl``.

The reward function gives every sample of an even-answer prompt 1.0 (a group dynamic sampling drops) and the
others a reward that varies in a group, and records every reward it returns: the figures must be the mean of all
of them and the kept groups' share of all groups, not those of the kept groups alone."""

import json

import pytest

import rlkit
from rlkit.envs import RewardFunctionEnvironment
from tests.session.conftest import tiny_overrides, varied_reward


@pytest.mark.filterwarnings("ignore:.*prompt groups have identical rewards")
def test_the_step_records_the_reward_over_everything_sampled(tmp_path):
    returned = []

    def half_solved(prompts, completions, answer, **columns):
        varied = varied_reward(prompts, completions, answer)
        rewards = [1.0 if int(a) % 2 == 0 else r for a, r in zip(answer, varied)]
        returned.extend(rewards)
        return rewards

    overrides = tiny_overrides(tmp_path, **{"grpo.use_dynamic_sampling": True,
                                            "grpo.dynamic_sampling_max_gen_batches": 3})
    with rlkit.Session.from_config("quickstart", overrides, env=RewardFunctionEnvironment(half_solved)) as session:
        session.log_to(run_dir=tmp_path / "run")
        metrics = session.step()
        session.stop_logging()
        kept = session.batch.rewards
    groups = len(returned) // 4
    assert metrics["dynamic_sampling/tries"] * 4 == groups  # every round's 4 prompts x 4 samples were scored
    assert metrics["rollout/reward_mean_all_sampled"] == pytest.approx(sum(returned) / len(returned), abs=1e-6)
    assert metrics["rollout/reward_mean"] == pytest.approx(kept.mean().item(), abs=1e-6)
    assert metrics["rollout/reward_mean_all_sampled"] != pytest.approx(metrics["rollout/reward_mean"])
    assert metrics["dynamic_sampling/kept_fraction"] == metrics["dynamic_sampling/kept_groups"] / groups < 1
    line = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert line["rollout/reward_mean_all_sampled"] == pytest.approx(metrics["rollout/reward_mean_all_sampled"])
    assert line["dynamic_sampling/kept_fraction"] == metrics["dynamic_sampling/kept_fraction"]
