"""GAE and PPO's clipped value loss against verl's ``compute_gae_advantage_return``, ``masked_whiten`` and
``compute_value_loss`` (token-mean), transcribed below from verl's core_algos.py, on the same inputs within 1e-6
(float64), with holes in the mask (a conversation's environment tokens) and ragged lengths."""

import pytest
import torch

from rlkit.algorithms.returns import clipped_value_loss, discounted_returns, gae

TOL = 1e-6


def verl_masked_whiten(values, mask):
    mean = (values * mask).sum() / mask.sum()
    variance = (((values - mean) ** 2) * mask).sum() / mask.sum()
    variance = variance * mask.sum() / (mask.sum() - 1)  # unbiased
    return (values - mean) * torch.rsqrt(variance + 1e-8)


def verl_gae(token_level_rewards, values, response_mask, gamma, lam):
    nextvalues, lastgaelam, advantages_reversed = 0, 0, []
    for t in reversed(range(token_level_rewards.shape[-1])):
        delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = values[:, t] * response_mask[:, t] + (1 - response_mask[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * response_mask[:, t] + (1 - response_mask[:, t]) * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    returns = advantages + values
    return verl_masked_whiten(advantages, response_mask), returns


def verl_value_loss(vpreds, values, returns, response_mask, cliprange_value):
    vpredclipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    vf_losses1, vf_losses2 = (vpreds - returns) ** 2, (vpredclipped - returns) ** 2
    clipped = torch.max(vf_losses1, vf_losses2)
    loss = 0.5 * (clipped * response_mask).sum() / response_mask.sum()
    clipfrac = (torch.gt(vf_losses2, vf_losses1).float() * response_mask).sum() / response_mask.sum()
    return loss, clipfrac


def inputs(seed=0, b=5, t=12):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(b, t, generator=g) > 0.25  # holes: environment tokens inside a row
    mask[:, 0] = False  # the prompt
    rewards = torch.zeros(b, t, dtype=torch.float64)
    for row in range(b):  # a reward on the last generated token, and one mid-row in some rows (a turn's)
        where = mask[row].nonzero().flatten()
        rewards[row, where[-1]] = torch.randn(1, generator=g, dtype=torch.float64).item()
        if row % 2:
            rewards[row, where[len(where) // 2]] = 0.5
    values = torch.randn(b, t, generator=g, dtype=torch.float64)
    return rewards, values, mask


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae_equals_verls(gamma, lam):
    rewards, values, mask = inputs()
    ours = gae(rewards, values, mask, gamma, lam)
    theirs = verl_gae(rewards, values, mask.double(), gamma, lam)
    for a, b in zip(ours, theirs):
        assert torch.allclose(a[mask], b[mask], atol=TOL, rtol=0)
        assert not a[~mask].any()


def test_gae_with_no_critic_and_lambda_one_is_the_discounted_return():
    rewards, values, mask = inputs(seed=1)
    advantages, returns = gae(rewards, torch.zeros_like(values), mask, 0.9, 1.0, whiten=False)
    expected = discounted_returns(rewards, mask, 0.9)
    assert torch.allclose(returns, expected, atol=1e-12) and torch.allclose(advantages, expected, atol=1e-12)


def test_the_value_loss_equals_verls():
    rewards, old_values, mask = inputs(seed=2)
    _, returns = gae(rewards, old_values, mask, 1.0, 0.95)
    predicted = old_values + torch.randn(old_values.shape, generator=torch.Generator().manual_seed(3),
                                         dtype=torch.float64) * 0.5
    ours = predicted.clone().requires_grad_(True)
    theirs = predicted.clone().requires_grad_(True)
    loss, clipped = clipped_value_loss(ours, old_values, returns, mask, 0.2, int(mask.sum()))
    expected, clipfrac = verl_value_loss(theirs, old_values, returns, mask.double(), 0.2)
    assert abs(loss.item() - expected.item()) < TOL and abs(clipped.item() / mask.sum().item() - clipfrac.item()) < TOL
    loss.backward()
    expected.backward()
    assert torch.allclose(ours.grad, theirs.grad, atol=TOL, rtol=0) and 0 < clipfrac < 1
