"""DAPO dynamic-sampling filter and soft overlong punishment."""

import pytest
import torch

from rlkit.algorithms import nonzero_variance_groups, overlong_reward_shaping


def test_nonzero_variance_groups():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5, 0.5, 0.0, 1.0])
    assert nonzero_variance_groups(rewards, 2).tolist() == [True, False, False, True]
    assert nonzero_variance_groups(torch.tensor([1.0, 0.0]), 1).tolist() == [False, False]
    with pytest.raises(ValueError):
        nonzero_variance_groups(torch.ones(3), 2)


def test_overlong_reward_shaping():
    # max_len 20, buffer 4 -> ramp starts after 16: (16 - L) / 4 * penalty, -penalty past 20
    lengths = torch.tensor([10, 16, 17, 18, 20, 21])
    out = overlong_reward_shaping(lengths, max_len=20, buffer_len=4, penalty=1.0)
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0]))
    out = overlong_reward_shaping(lengths, max_len=20, buffer_len=4, penalty=0.5)
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, -0.125, -0.25, -0.5, -0.5]))
    with pytest.raises(ValueError, match="buffer_len"):
        overlong_reward_shaping(lengths, max_len=20, buffer_len=0, penalty=1.0)
