"""EnvReturn validates itself, so no stage has to re-check an environment's output."""

import math

import numpy as np
import pytest
import torch

from rlkit.envs.base import EnvReturn, as_reward, check_batch, completion_of, prompt_of, sample_error


def test_single_turn_shapes_and_values():
    r = EnvReturn.single_turn([1.0, 0.0, 0.5], [{}, {}, {}], ["sample 1: ValueError: x"])
    assert r.rewards.dtype == torch.float32 and r.rewards.tolist() == [1.0, 0.0, 0.5]
    assert r.done.dtype == torch.bool and r.done.tolist() == [True, True, True]
    assert r.observations == [None, None, None]
    assert r.num_errors == 1 and len(r) == 3
    assert repr(r) == "EnvReturn(B=3, mean_reward=0.500, done=3/3, errors=1)"


def test_multi_turn_return_carries_observations_for_unfinished_samples():
    obs = {"role": "user", "content": "tool output: 42"}
    r = EnvReturn(torch.tensor([0.0, 1.0]), torch.tensor([False, True]), [obs, None], [{}, {}], [])
    assert r.observations[0] == obs and r.done.tolist() == [False, True]


@pytest.mark.parametrize(
    "rewards, done, observations, match",
    [
        (torch.tensor([math.nan]), torch.tensor([True]), [None], "finite"),
        (torch.tensor([1.0], dtype=torch.float64), torch.tensor([True]), [None], "float32"),
        (torch.tensor([1.0]), torch.tensor([1]), [None], "bool"),
        (torch.tensor([1.0]), torch.tensor([True]), [{"role": "user", "content": "x"}], "unfinished"),
        (torch.tensor([1.0]), torch.tensor([False]), [None], "unfinished"),
        (torch.tensor([1.0, 2.0]), torch.tensor([True, True]), [None], "observations"),
    ],
)
def test_inconsistent_returns_are_rejected(rewards, done, observations, match):
    with pytest.raises(ValueError, match=match):
        EnvReturn(rewards, done, observations, [{}] * len(observations), [])


def test_conversation_helpers():
    conv = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "2+2"},
        {"role": "assistant", "content": "4"},
    ]
    assert completion_of(conv) == "4"
    assert prompt_of(conv) == "2+2"
    assert prompt_of([{"role": "assistant", "content": "4"}]) == ""
    with pytest.raises(ValueError, match="role 'user'"):
        completion_of(conv[:2])
    with pytest.raises(ValueError, match="2 conversations but 1 rows"):
        check_batch([conv, conv], [{}])


def test_as_reward_accepts_numbers_and_rejects_the_rest():
    assert as_reward(np.float32(0.25)) == 0.25
    assert as_reward(torch.tensor(2.0)) == 2.0
    assert as_reward(True) == 1.0 and as_reward(3) == 3.0
    for bad, exc in [("1.0", TypeError), (None, TypeError), (math.nan, ValueError), (-math.inf, ValueError)]:
        with pytest.raises(exc):
            as_reward(bad)
    assert sample_error(4, KeyError("answer")) == "sample 4: KeyError: 'answer'"
