"""Score stage: a reward that fails on (more than a share of) every sample is an error, not a warning."""

import warnings

import pytest
import torch

from rlkit.config.loading import load_config
from rlkit.envs import RewardFunctionEnvironment
from rlkit.errors import ConfigError, RewardError
from rlkit.stages import ScoreSettings, score
from rlkit.trajectories import Trajectories


def batch_of(completions, answers):
    """One prompt per sample (group size 1), rows carrying the answer column."""
    b, t = len(completions), 4
    return Trajectories(
        prompts=tuple(f"{i}+{i}=" for i in range(b)), completions=tuple(completions),
        input_ids=torch.zeros(b, t, dtype=torch.long), attention_mask=torch.ones(b, t, dtype=torch.bool),
        loss_mask=torch.ones(b, t, dtype=torch.bool), generator_logprobs=torch.zeros(b, t),
        finish_reasons=("stop",) * b, group_size=1, policy_version=0,
        rows=tuple({"prompt": f"{i}+{i}=", "answer": a} for i, a in enumerate(answers)),
    )


def typo_reward(prompts, completions, answer):
    return [float(c == anwser) for c, anwser in zip(completions, answr)]  # noqa: F821 - the typo under test


def parse_reward(prompts, completions, answer):
    return [float(int(c) == int(a)) for c, a in zip(completions, answer)]


def test_reward_failing_on_every_sample_raises_with_the_first_exception_and_sample():
    batch = batch_of(["4", "6", "8"], ["4", "6", "9"])
    with pytest.raises(RewardError) as info:
        score(batch, RewardFunctionEnvironment(typo_reward))
    msg = str(info.value)
    assert "every sample" in msg and "'typo_reward'" in msg
    assert "NameError: name 'answr' is not defined" in msg
    assert "sample 0: prompt '0+0=', completion '4'" in msg
    assert "env.max_reward_failure_fraction" in msg


def test_failures_above_the_share_raise_and_below_it_warn_with_a_count():
    # 2 of 4 unparsable: 0.5 is not more than the default share 0.5 -> a warning naming the count
    batch = batch_of(["4", "x", "y", "8"], ["4", "6", "8", "8"])
    with pytest.warns(UserWarning, match=r"2 of 4 sample\(s\) got reward 0"):
        out = score(batch, RewardFunctionEnvironment(parse_reward))
    assert out.rewards.tolist() == [1.0, 0.0, 0.0, 1.0] and len(out.reward_errors) == 2
    # with a share of 0.25, the same batch is an error that names the count and the first failing sample
    with pytest.raises(RewardError, match=r"2 of 4 samples \(more than env.max_reward_failure_fraction=0.25\)") as info:
        score(batch, RewardFunctionEnvironment(parse_reward), ScoreSettings(max_failure_fraction=0.25))
    assert "sample 1: ValueError: invalid literal for int() with base 10: 'x'" in str(info.value)
    assert "completion 'x'" in str(info.value)


def test_every_sample_failing_raises_even_with_share_1():
    with pytest.raises(RewardError, match="every sample"):
        score(batch_of(["x", "y"], ["1", "2"]), RewardFunctionEnvironment(parse_reward), ScoreSettings(max_failure_fraction=1.0))


def test_no_failure_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = score(batch_of(["4", "5"], ["4", "6"]), RewardFunctionEnvironment(parse_reward))
    assert out.rewards.tolist() == [1.0, 0.0]


def test_config_key_is_validated():
    assert load_config("quickstart").env.max_reward_failure_fraction == 0.5
    assert load_config("quickstart", ["env.max_reward_failure_fraction=0.1"]).env.max_reward_failure_fraction == 0.1
    with pytest.raises(ConfigError, match=r"env\.max_reward_failure_fraction"):
        load_config("quickstart", ["env.max_reward_failure_fraction=1.5"])
