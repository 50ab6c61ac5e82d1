"""Overflow guard: log-ratios past exp()'s fp32 range (~89) give finite losses, gradients and metrics.

Hand-derived: ppo_clip clamps log r to [-20, 20] (constant ratio e^20 and no gradient past it), GSPO its
sequence log-ratio to <= 10 (GSPO-token keeps the gradient, weighted by e^10), k3 its input to [-20, 20],
corrections their log-ratios to [-20, 20].
"""

import math

import pytest
import torch

from rlkit.algorithms import CORRECTIONS, POLICY_LOSSES, CorrectionParams, PolicyLossParams, kl_penalty

F32, F64 = torch.float32, torch.float64
E20, E10 = math.exp(20.0), math.exp(10.0)


def run(name, d, adv, dtype=F32, params=PolicyLossParams()):
    """One row, every token valid, logprobs = old + d; returns (loss, metric maps, grad wrt logprobs)."""
    old = torch.full((1, len(d)), -1.0, dtype=dtype)
    logprobs = (old + torch.tensor([d], dtype=dtype)).requires_grad_(True)
    mask = torch.ones(1, len(d), dtype=torch.bool)
    loss, maps = POLICY_LOSSES.get(name)(logprobs, old, torch.tensor([adv], dtype=dtype), mask, params)
    loss.sum().backward()
    return loss.detach(), maps, logprobs.grad


@pytest.mark.parametrize("name", ["ppo_clip", "gspo", "cispo", "reinforce"])
@pytest.mark.parametrize("params", [PolicyLossParams(), PolicyLossParams(ratio_clip_c=3.0)])
@pytest.mark.parametrize("d", [100.0, -100.0, 1000.0])
@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_extreme_log_ratio_gives_finite_loss_gradient_and_metrics(name, params, d, adv):
    loss, maps, grad = run(name, [d, 0.0], [adv, adv], params=params)
    assert torch.isfinite(loss).all(), loss
    assert torch.isfinite(grad).all(), grad
    assert all(torch.isfinite(v).all() for v in maps.values()), maps


def test_ppo_clip_values_at_and_past_the_clamp():
    # A = -1, no dual clip, so -A r is the pessimistic branch for r > 1 - eps_lo:
    #   d = 19  (inside):  loss e^19, grad -A r = e^19
    #   d = 100 (clamped): loss e^20, grad 0 (ratio constant past the clamp)
    #   d = -100 (clamped, r = e^-20 < 0.8): clipped low -> loss 0.8, grad 0
    loss, maps, grad = run("ppo_clip", [19.0, 100.0, -100.0], [-1.0, -1.0, -1.0], dtype=F64)
    torch.testing.assert_close(loss, torch.tensor([[math.exp(19.0), E20, 0.8]], dtype=F64))
    torch.testing.assert_close(grad, torch.tensor([[math.exp(19.0), 0.0, 0.0]], dtype=F64))
    torch.testing.assert_close(maps["probs_ratio"], torch.tensor([[math.exp(19.0), E20, math.exp(-20.0)]], dtype=F64))
    # A = +1: d = 100 clipped high -> loss -1.2, grad 0; d = -100 -> loss -e^-20, grad 0 past the clamp
    loss, _, grad = run("ppo_clip", [100.0, -100.0], [1.0, 1.0], dtype=F64)
    torch.testing.assert_close(loss, torch.tensor([[-1.2, -math.exp(-20.0)]], dtype=F64))
    assert grad.tolist() == [[0.0, 0.0]]


def test_ppo_clip_fp32_clipped_token_has_zero_not_nan_gradient():
    # The reported failure: fp32, log r = 100, A > 0: clipped high, the gradient must be exactly 0.
    loss, _, grad = run("ppo_clip", [100.0], [1.0])
    assert loss.item() == pytest.approx(-1.2) and grad.item() == 0.0
    # A < 0: the loss is e^20 (finite), not inf
    loss, _, _ = run("ppo_clip", [100.0], [-1.0])
    assert loss.item() == pytest.approx(E20, rel=1e-6)


def test_gspo_sequence_log_ratio_capped_at_10():
    # one sequence, tokens d = (30, 0): mean log-ratio 15 -> capped at 10; A = -1 -> loss e^10 on each token,
    # GSPO-token gradient s_i * (-A) = e^10 on each token. A mean of 9 (d = 18, 0) is untouched.
    loss, maps, grad = run("gspo", [30.0, 0.0], [-1.0, -1.0], dtype=F64)
    torch.testing.assert_close(loss, torch.tensor([[E10, E10]], dtype=F64))
    torch.testing.assert_close(grad, torch.tensor([[E10, E10]], dtype=F64))
    loss, _, _ = run("gspo", [18.0, 0.0], [-1.0, -1.0], dtype=F64)
    torch.testing.assert_close(loss, torch.tensor([[math.exp(9.0)] * 2], dtype=F64))


def test_cispo_weight_and_gradient_past_the_clamp():
    # cap 1 + 5 = 6 < e^20: the weight is 6 whatever the log-ratio; grad -w A = 6 for A = -1
    loss, maps, grad = run("cispo", [100.0], [-1.0], dtype=F64)
    torch.testing.assert_close(loss, torch.tensor([[6.0 * 99.0]], dtype=F64))  # -6 * (-1) * logp, logp = 99
    torch.testing.assert_close(grad, torch.tensor([[6.0]], dtype=F64))
    assert maps["probs_ratio"].item() == pytest.approx(E20)


def test_k3_clamps_its_input_without_kl_clamp():
    # log_ratio = ref - logp = 100 -> clamped to 20: k3 = e^20 - 21, gradient 0 past the clamp (fp32)
    logp = torch.tensor([[-100.0, -1.0]], requires_grad=True)
    kl = kl_penalty(logp, torch.tensor([[0.0, -1.5]]), "k3")
    assert math.isfinite(kl[0, 0].item()) and kl[0, 0].item() == pytest.approx(E20 - 21, rel=1e-6)
    assert kl[0, 1].item() == pytest.approx(math.exp(-0.5) - 0.5, abs=1e-6)  # normal values unchanged
    kl.sum().backward()
    assert torch.isfinite(logp.grad).all()
    assert logp.grad[0, 0].item() == 0.0 and logp.grad[0, 1].item() == pytest.approx(1 - math.exp(-0.5), abs=1e-6)


@pytest.mark.parametrize("name", ["none", "tis", "seq_mask"])
def test_corrections_stay_finite_past_exp_range(name):
    # prev - gen = (100, 0.5): ratio e^20 (clamped) and e^0.5 (unchanged)
    prev, gen = torch.tensor([[0.0, -1.0]]), torch.tensor([[-100.0, -1.5]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    c = CORRECTIONS.get(name)(prev, gen, mask, CorrectionParams(tis_cap=2.0))
    assert torch.isfinite(c.weights).all() and torch.isfinite(c.ratio).all()
    assert c.ratio[0, 0].item() == pytest.approx(E20, rel=1e-6)
    assert c.ratio[0, 1].item() == pytest.approx(math.exp(0.5), rel=1e-6)
    assert all(math.isfinite(v.item()) for v in c.metrics(mask).values())

