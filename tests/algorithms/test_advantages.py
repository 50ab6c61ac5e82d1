"""Advantage estimators against hand-derived values (derivations in the comments)."""

import math

import pytest
import torch

from rlkit.algorithms import (
    AdvantageParams,
    RunningBaseline,
    compute_advantages,
    group_stats,
    zero_variance_group_fraction,
)

SQRT_1_3 = math.sqrt(1 / 3)  # unbiased std of (1, 0, 0): sum of squared deviations 6/9, / (G - 1) = 1/3


def full_mask(b, t=2):
    return torch.ones((b, t), dtype=torch.bool)


def test_grpo_group_mean_and_unbiased_std():
    # group 1: (1, 0, 0): mean 1/3, std sqrt(1/3) -> (2/3, -1/3, -1/3) / 0.57735
    # group 2: (2, 2, 2): std 0 -> left unscaled: r - mean = 0
    rewards = torch.tensor([1.0, 0.0, 0.0, 2.0, 2.0, 2.0])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    adv = compute_advantages("grpo", rewards, mask, 3)
    a, b = (2 / 3) / SQRT_1_3, (-1 / 3) / SQRT_1_3  # 1.154701, -0.577350
    expected = torch.tensor([[a, a, 0], [b, 0, 0], [b, b, b], [0, 0, 0], [0, 0, 0], [0, 0, 0]])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)
    assert (adv[~mask] == 0).all()


def test_grpo_leave_one_out_baseline():
    # (1, 0, 0): LOO baselines (0, 1/2, 1/2) -> centred (1, -1/2, -1/2); whole-group std sqrt(1/3)
    rewards = torch.tensor([1.0, 0.0, 0.0])
    cfg = AdvantageParams(use_leave_one_out_baseline=True)
    adv = compute_advantages("grpo", rewards, full_mask(3), 3, cfg)[:, 0]
    torch.testing.assert_close(adv, torch.tensor([1.732051, -0.866025, -0.866025]), atol=1e-5, rtol=0)
    unscaled = AdvantageParams(use_leave_one_out_baseline=True, normalize_rewards=False)
    adv = compute_advantages("grpo", rewards, full_mask(3), 3, unscaled)[:, 0]
    torch.testing.assert_close(adv, torch.tensor([1.0, -0.5, -0.5]))


def test_grpo_without_std_scaling_and_with_g2():
    # (1, 3): mean 2, unbiased std sqrt(((-1)^2 + 1^2) / 1) = sqrt(2) -> (-1, 1) / 1.414214
    rewards = torch.tensor([1.0, 3.0, 5.0, 5.0])
    adv = compute_advantages("grpo", rewards, full_mask(4), 2)[:, 0]
    torch.testing.assert_close(adv, torch.tensor([-0.707107, 0.707107, 0.0, 0.0]), atol=1e-5, rtol=0)
    adv = compute_advantages("grpo", rewards, full_mask(4), 2, AdvantageParams(normalize_rewards=False))[:, 0]
    torch.testing.assert_close(adv, torch.tensor([-1.0, 1.0, 0.0, 0.0]))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
@pytest.mark.parametrize("loo", [False, True])
def test_single_sample_groups_give_zero_not_nan(name, loo):
    rewards = torch.tensor([3.0, -1.0, 0.5])
    adv = compute_advantages(name, rewards, full_mask(3), 1, AdvantageParams(use_leave_one_out_baseline=loo))
    assert torch.equal(adv, torch.zeros(3, 2))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_all_equal_rewards_give_exactly_zero(name):
    # float32 mean(0.9, 0.9, 0.9) misses 0.9 by 6e-8 and the std comes out 7e-8, not 0: without the
    # all-equal guard grpo would give 6e-8 / (7e-8 + 1e-6) = 0.055 instead of 0
    rewards = torch.tensor([0.9, 0.9, 0.9, 0.7, 0.7, 0.7])
    adv = compute_advantages(name, rewards, full_mask(6), 3)
    assert torch.equal(adv, torch.zeros(6, 2))


def test_dr_grpo_is_centred_but_not_scaled():
    # (1, 0, 0) -> mean 1/3 -> (2/3, -1/3, -1/3); (4, 2, 0) -> mean 2 -> (2, 0, -2)
    rewards = torch.tensor([1.0, 0.0, 0.0, 4.0, 2.0, 0.0])
    adv = compute_advantages("dr_grpo", rewards, full_mask(6), 3)[:, 0]
    torch.testing.assert_close(adv, torch.tensor([2 / 3, -1 / 3, -1 / 3, 2.0, 0.0, -2.0]))


def test_rloo_leave_one_out():
    # (1, 2, 3, 6): sum 12, baselines (11/3, 10/3, 3, 2) -> (-8/3, -4/3, 0, 4) = 4/3 * (r - 3)
    rewards = torch.tensor([1.0, 2.0, 3.0, 6.0])
    adv = compute_advantages("rloo", rewards, full_mask(4), 4)[:, 0]
    torch.testing.assert_close(adv, torch.tensor([-8 / 3, -4 / 3, 0.0, 4.0]))
    # G = 2: the baseline is the other sample: (1, 3) -> (-2, 2)
    adv = compute_advantages("rloo", torch.tensor([1.0, 3.0]), full_mask(2), 2)[:, 0]
    torch.testing.assert_close(adv, torch.tensor([-2.0, 2.0]))


def test_group_stats_and_zero_variance_fraction():
    mean, std = group_stats(torch.tensor([1.0, 0.0, 0.0, 2.0, 2.0, 2.0]), 3)
    torch.testing.assert_close(mean, torch.tensor([1 / 3, 2.0]))
    torch.testing.assert_close(std, torch.tensor([SQRT_1_3, 0.0]))
    _, std = group_stats(torch.tensor([1.0, 5.0]), 1)
    assert torch.equal(std, torch.zeros(2))
    assert zero_variance_group_fraction(torch.tensor([1.0, 0.0, 0.0, 2.0, 2.0, 2.0]), 3) == 0.5
    assert zero_variance_group_fraction(torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0]), 2) == 0.5
    assert zero_variance_group_fraction(torch.tensor([1.0, 0.0]), 1) == 1.0


def test_reinforce_pp_discounts_a_conversation_by_its_generated_tokens():
    # prompt, turn 1, tool result, turn 2: generated positions 2, 3, 7, 8 are steps 0..3; reward 1 on the last.
    # gamma 0.5: returns (0.125, 0.25, 0.5, 1) (by position, position 3 would get 0.5**5); mean 0.46875
    mask = torch.tensor([[0, 0, 1, 1, 0, 0, 0, 1, 1, 0]], dtype=torch.bool)
    cfg = AdvantageParams(gamma=0.5, normalize_rewards=False)
    adv = compute_advantages("reinforce_pp", torch.tensor([1.0]), mask, 1, cfg)
    m = 0.46875
    expected = torch.tensor([[0, 0, 0.125 - m, 0.25 - m, 0, 0, 0, 0.5 - m, 1 - m, 0]])
    torch.testing.assert_close(adv, expected, atol=1e-7, rtol=0)


def test_reinforce_pp_kl_in_reward_and_global_whitening():
    # row 0: reward 1, 3 valid tokens, kl (0.2, 0, 0.4): token rewards (-0.1, 0, 1 - 0.2) -> returns (0.7, 0.8, 0.8)
    # row 1: reward 0, 2 valid tokens, kl (0.2, 0.2):    token rewards (-0.1, -0.1)      -> returns (-0.2, -0.1)
    # row 2: fully masked -> 0.  Valid returns: mean 2/5 = 0.4; deviations (.3, .4, .4, -.6, -.5);
    # population var (0.09 + 0.16 + 0.16 + 0.36 + 0.25) / 5 = 0.204, std 0.451664
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    kl = torch.tensor([[0.2, 0.0, 0.4, 9.0], [0.2, 0.2, 9.0, 9.0], [9.0, 9.0, 9.0, 9.0]])  # 9 on padding: ignored
    rewards = torch.tensor([1.0, 0.0, 5.0])
    cfg = AdvantageParams(kl_coef=0.5)
    adv = compute_advantages("reinforce_pp", rewards, mask, 1, cfg, kl=kl)
    s = 0.451664
    expected = torch.tensor([[0.3 / s, 0.4 / s, 0.4 / s, 0], [-0.6 / s, -0.5 / s, 0, 0], [0, 0, 0, 0]])
    torch.testing.assert_close(adv, expected, atol=1e-4, rtol=0)
    # without std scaling only the batch mean is removed
    cfg = AdvantageParams(kl_coef=0.5, normalize_rewards=False)
    adv = compute_advantages("reinforce_pp", rewards, mask, 1, cfg, kl=kl)
    expected = torch.tensor([[0.3, 0.4, 0.4, 0], [-0.6, -0.5, 0, 0], [0, 0, 0, 0]])
    torch.testing.assert_close(adv, expected, atol=1e-6, rtol=0)


def test_reinforce_pp_needs_kl_when_kl_coef_set():
    with pytest.raises(ValueError, match="kl"):
        compute_advantages("reinforce_pp", torch.ones(2), full_mask(2), 1, AdvantageParams(kl_coef=0.1))
    assert AdvantageParams(kl_coef=0.1).kl_in_reward and not AdvantageParams().kl_in_reward


def test_reinforce_baseline_uses_and_updates_running_mean():
    state = RunningBaseline()
    cfg = AdvantageParams(baseline_momentum=0.9)
    # first batch: baseline = its own mean 2 -> (-1, 1); state 2
    adv = compute_advantages("reinforce_baseline", torch.tensor([1.0, 3.0]), full_mask(2), 1, cfg, state=state)
    torch.testing.assert_close(adv[:, 0], torch.tensor([-1.0, 1.0]))
    assert state.value == 2.0 and state.updates == 1
    # second batch: baseline 2 (before the update) -> (2, 4); state 0.9 * 2 + 0.1 * 5 = 2.3
    adv = compute_advantages("reinforce_baseline", torch.tensor([4.0, 6.0]), full_mask(2), 2, cfg, state=state)
    torch.testing.assert_close(adv[:, 0], torch.tensor([2.0, 4.0]))
    assert state.value == pytest.approx(2.3)
    adv = compute_advantages("reinforce_baseline", torch.tensor([0.0, 0.0]), full_mask(2), 1, cfg, state=state)
    torch.testing.assert_close(adv[:, 0], torch.tensor([-2.3, -2.3]))


def test_reinforce_baseline_without_state_fails():
    with pytest.raises(ValueError, match="RunningBaseline"):
        compute_advantages("reinforce_baseline", torch.ones(2), full_mask(2), 1)


def test_bad_group_size_fails_and_inputs_are_not_mutated():
    with pytest.raises(ValueError, match="groups of 2"):
        compute_advantages("grpo", torch.ones(5), full_mask(5), 2)
    rewards = torch.tensor([1.0, 0.0])
    compute_advantages("grpo", rewards, full_mask(2), 2)
    assert torch.equal(rewards, torch.tensor([1.0, 0.0]))


def test_custom_estimator_callable():
    def constant(rewards, mask, group_size, cfg, kl=None, state=None):
        return mask.float() * 7

    adv = compute_advantages(constant, torch.ones(2), torch.tensor([[1, 0], [1, 1]], dtype=torch.bool), 1)
    assert torch.equal(adv, torch.tensor([[7.0, 0.0], [7.0, 7.0]]))
