"""DPO, robust DPO and IPO losses against a hand-computed case and TRL's formula (``DPOTrainer._compute_loss`` in TRL
1.16, the version bench/.venv-trl pins, with its default reverse-KL scores), in float64 within 1e-6, values and
gradients; and the per-token weights that stand in for the pair loss in a train step."""

import math

import pytest
import torch
import torch.nn.functional as F

from rlkit.algorithms.preference import dpo_token_weights, preference_loss, sequence_logprobs

TOL = 1e-6


def trl_dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta, loss_type, label_smoothing):
    """TRL 1.16's losses for these loss types, written out from its source: ``delta = (chosen - ref_chosen) -
    (rejected - ref_rejected)``; sigmoid: ``-logsigmoid(beta*delta)``; robust: ``(-(1-ls)*logsigmoid(beta*delta) +
    ls*logsigmoid(-beta*delta)) / (1-2*ls)``; ipo: ``(delta - 1/(2*beta))**2`` on length-averaged scores; rewards
    ``beta * (logps - ref_logps)``."""
    logits = (chosen - ref_chosen) - (rejected - ref_rejected)
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * logits)
    elif loss_type == "robust":
        clean = -(1 - label_smoothing) * F.logsigmoid(beta * logits)
        flipped = -label_smoothing * F.logsigmoid(-beta * logits)
        losses = (clean - flipped) / (1 - 2 * label_smoothing)
    else:
        losses = (logits - 1 / (2 * beta)) ** 2
    return losses, beta * (chosen - ref_chosen).detach(), beta * (rejected - ref_rejected).detach()


def test_a_hand_computed_pair():
    one = lambda v: torch.tensor([v], dtype=torch.float64)  # noqa: E731
    out = preference_loss(one(-1.0), one(-3.0), one(-2.0), one(-2.0), beta=0.1)
    assert out.losses.item() == pytest.approx(math.log1p(math.exp(-0.2)), abs=1e-12)  # -log sigmoid(0.1 * 2)
    assert out.chosen_rewards.item() == pytest.approx(0.1) and out.rejected_rewards.item() == pytest.approx(-0.1)
    ipo = preference_loss(one(-1.0), one(-3.0), one(-2.0), one(-2.0), beta=0.1, loss_type="ipo")
    assert ipo.losses.item() == pytest.approx((2 - 5) ** 2)
    metrics = out.metrics()
    assert metrics["rewards/margins"] == pytest.approx(0.2) and metrics["rewards/accuracies"] == 1.0


@pytest.mark.parametrize("loss_type,label_smoothing", [("sigmoid", 0.0), ("robust", 0.1), ("ipo", 0.0)])
def test_losses_and_gradients_equal_trls_formula(loss_type, label_smoothing):
    g = torch.Generator().manual_seed(0)
    inputs = [(torch.randn(16, generator=g, dtype=torch.float64) * 5 - 20) for _ in range(4)]
    ours_in = [t.clone().requires_grad_(True) for t in inputs]
    theirs_in = [t.clone().requires_grad_(True) for t in inputs]
    ours = preference_loss(*ours_in, beta=0.2, loss_type=loss_type, label_smoothing=label_smoothing)
    theirs = trl_dpo_loss(*theirs_in, 0.2, loss_type, label_smoothing)
    assert torch.allclose(ours.losses, theirs[0], atol=TOL, rtol=0)
    assert torch.allclose(ours.chosen_rewards, theirs[1], atol=TOL) and torch.allclose(ours.rejected_rewards, theirs[2])
    ours.losses.mean().backward()
    theirs[0].mean().backward()
    for a, b in zip(ours_in[:2], theirs_in[:2]):  # the policy's logprobs carry the gradient
        assert torch.allclose(a.grad, b.grad, atol=TOL, rtol=0)


@pytest.mark.parametrize("loss_type,sft_weight", [("sigmoid", 0.0), ("ipo", 0.0), ("sigmoid", 0.7)])
def test_token_weights_are_the_pair_losss_gradient(loss_type, sft_weight):
    g = torch.Generator().manual_seed(1)
    n, t = 3, 7
    mask = torch.rand(2 * n, t, generator=g) > 0.3
    policy = torch.randn(2 * n, t, generator=g, dtype=torch.float64) - 1
    reference = torch.randn(2 * n, t, generator=g, dtype=torch.float64) - 1
    weights, pairs = dpo_token_weights(policy, reference, mask, beta=0.3, loss_type=loss_type, sft_weight=sft_weight)
    direct = policy.clone().requires_grad_(True)
    seq = sequence_logprobs(direct, mask, mean=loss_type == "ipo")
    ref = sequence_logprobs(reference, mask, mean=loss_type == "ipo")
    expected = trl_dpo_loss(seq[:n], seq[n:], ref[:n], ref[n:], 0.3, loss_type, 0.0)[0]
    # TRL's "sft" loss type: -chosen_per_token_logps[chosen_mask].mean(), weighted by loss_weights
    (expected.mean() + sft_weight * -direct[:n][mask[:n]].mean()).backward()
    assert torch.allclose(weights.double(), direct.grad, atol=1e-7, rtol=1e-5)
    assert torch.allclose(pairs.losses, expected.detach(), atol=TOL)
    assert not weights[~mask].any()


def test_label_smoothing_outside_the_robust_loss_is_refused():
    one = torch.zeros(1)
    with pytest.raises(ValueError, match="'robust' loss only"):
        preference_loss(one, one, one, one, beta=0.1, loss_type="sigmoid", label_smoothing=0.1)


def test_an_odd_batch_is_refused():
    with pytest.raises(ValueError, match="2N rows"):
        dpo_token_weights(torch.zeros(3, 4), torch.zeros(3, 4), torch.ones(3, 4, dtype=torch.bool), beta=0.1)


def test_bradley_terry_equals_trls_reward_trainer_formula():
    """TRL 1.16's ``RewardTrainer.compute_loss``: ``-logsigmoid(r_c - r_r - margin).mean()`` plus
    ``center_rewards_coefficient * mean((r_c + r_r)**2)``."""
    from rlkit.algorithms.preference import bradley_terry_loss

    g = torch.Generator().manual_seed(2)
    chosen, rejected, margin = (torch.randn(9, generator=g, dtype=torch.float64) for _ in range(3))
    expected = -F.logsigmoid(chosen - rejected - margin).mean() + 0.01 * torch.mean((chosen + rejected) ** 2)
    assert abs(bradley_terry_loss(chosen, rejected, margin=margin, center_coefficient=0.01) - expected) < 1e-12
    assert abs(bradley_terry_loss(chosen, rejected) + F.logsigmoid(chosen - rejected).mean()) < 1e-12
    one = torch.tensor([2.0], dtype=torch.float64)
    assert bradley_terry_loss(one, one - 2).item() == pytest.approx(math.log1p(math.exp(-2.0)))
