import pytest
import torch

from rlkit.algorithms.returns import discounted_returns


def test_returns_discount_by_generated_tokens_not_by_positions():
    #        prompt     turn 1    tool result   turn 2    pad
    mask = torch.tensor([[0, 0, 1, 1, 0, 0, 0, 1, 1, 0]], dtype=torch.bool)
    rewards = torch.zeros(1, 10)
    rewards[0, 3], rewards[0, 8] = 1.0, 2.0
    # generated positions 2, 3, 7, 8 are steps k = 0..3; gamma = 0.5:
    # G(8) = 2, G(7) = 0.5 * 2 = 1, G(3) = 1 + 0.5 * 1 = 1.5, G(2) = 0.5 * 1.5 = 0.75
    expected = torch.tensor([[0, 0, 0.75, 1.5, 0, 0, 0, 1.0, 2.0, 0]])
    assert torch.equal(discounted_returns(rewards, mask, 0.5), expected)
    # discounting by position would have given G(3) = 1 + 0.5**5 * 2
    assert discounted_returns(rewards, mask, 1.0).tolist() == [[0, 0, 3, 3, 0, 0, 0, 2, 2, 0]]


def test_without_holes_it_is_the_usual_return_in_float64():
    torch.manual_seed(0)
    rewards = torch.randn(3, 6, dtype=torch.float64)
    mask = torch.ones(3, 6, dtype=torch.bool)
    for gamma in (0.9, 1.0):  # (1.0 takes the cumulative-sum path)
        reference = torch.tensor([[sum(gamma ** (s - t) * rewards[b, s].item() for s in range(t, 6)) for t in range(6)]
                                  for b in range(3)], dtype=torch.float64)
        assert torch.allclose(discounted_returns(rewards, mask, gamma), reference, atol=1e-12), gamma


def test_a_reward_outside_the_mask_is_an_error():
    mask = torch.tensor([[1, 0]], dtype=torch.bool)
    with pytest.raises(ValueError, match="outside the mask"):
        discounted_returns(torch.tensor([[0.0, 1.0]]), mask)
