"""Policy losses: hand-derived values, clip bounds, stopped gradients, and float64 gradient references."""

import math

import pytest
import torch

from rlkit.algorithms import POLICY_LOSS_METRICS, POLICY_LOSSES, PolicyLossParams, aggregate, count_valid

F64 = torch.float64


def run(name, d, adv, mask, params, old=-1.0):
    """logprobs = old + d (so ratio = exp(d)); returns (per-token loss, metric maps, grad wrt logprobs)."""
    old_lp = torch.full_like(torch.tensor(d, dtype=F64), old)
    logprobs = (old_lp + torch.tensor(d, dtype=F64)).requires_grad_(True)
    mask = torch.tensor(mask, dtype=torch.bool)
    loss, maps = POLICY_LOSSES.get(name)(logprobs, old_lp, torch.tensor(adv, dtype=F64), mask, params)
    loss.sum().backward()
    return loss.detach(), maps, logprobs.grad


def token_mean(maps, mask):
    mask = torch.tensor(mask, dtype=torch.bool)
    return {k: (v * mask).sum().item() / mask.sum().item() for k, v in maps.items()}


# ---- ppo_clip ------------------------------------------------------------------------------------------
def test_ppo_clip_asymmetric_bounds():
    # eps_lo 0.2, eps_hi 0.28 (DAPO clip-higher): bounds [0.8, 1.28]
    #   t0: r = e^0.1 = 1.105171 inside, A = 2  -> loss -2.210342, grad -A r = -2.210342
    #   t1: r = e^0.4 = 1.491825 > 1.28, A = 1  -> loss -1.28, clipped high, grad 0
    #   t2: r = 1.491825 > 1.28, A = -1         -> loss max(1.491825, 1.28) = 1.491825, grad 1.491825
    #   t3: r = e^-0.5 = 0.606531 < 0.8, A = -1 -> loss max(0.606531, 0.8) = 0.8, clipped low, grad 0
    #   t4: r = 0.606531 < 0.8, A = 1           -> loss max(-0.606531, -0.8) = -0.606531, grad -0.606531
    #   t5..t7: padding (garbage ratio e^50) -> 0
    d = [[0.1, 0.4, 0.4, -0.5], [-0.5, 50.0, 50.0, 50.0]]
    adv = [[2.0, 1.0, -1.0, -1.0], [1.0, 1.0, 1.0, 1.0]]
    mask = [[1, 1, 1, 1], [1, 0, 0, 0]]
    e01, e04, em05 = math.exp(0.1), math.exp(0.4), math.exp(-0.5)
    loss, maps, grad = run("ppo_clip", d, adv, mask, PolicyLossParams(ratio_clip_min=0.2, ratio_clip_max=0.28))
    torch.testing.assert_close(loss, torch.tensor([[-2 * e01, -1.28, e04, 0.8], [-em05, 0, 0, 0]], dtype=F64))
    torch.testing.assert_close(grad, torch.tensor([[-2 * e01, 0, e04, 0], [-em05, 0, 0, 0]], dtype=F64))
    clipped = torch.tensor([[False, True, False, True], [False, False, False, False]])
    assert (grad[clipped] == 0).all() and (grad[torch.tensor(mask, dtype=torch.bool) & ~clipped] != 0).all()
    m = token_mean(maps, mask)
    assert m["clipped_fraction"] == pytest.approx(2 / 5)
    assert m["clipped_high_fraction"] == pytest.approx(1 / 5) and m["clipped_low_fraction"] == pytest.approx(1 / 5)
    assert m["dual_clipped_fraction"] == 0.0
    assert m["probs_ratio"] == pytest.approx((e01 + 2 * e04 + 2 * em05) / 5)
    assert m["probs_ratio_clamped"] == pytest.approx((e01 + 2 * 1.28 + 2 * 0.8) / 5)
    assert set(maps) == set(POLICY_LOSS_METRICS)


def test_ppo_clip_ratio_exactly_on_each_bound_keeps_its_gradient():
    # choose eps so the bounds equal the float64 ratios exactly: r_hi = e^0.25, r_lo = e^-0.25
    r_hi, r_lo = math.exp(0.25), math.exp(-0.25)
    params = PolicyLossParams(ratio_clip_min=1 - r_lo, ratio_clip_max=r_hi - 1)
    assert 1 - params.ratio_clip_min == r_lo and 1 + params.ratio_clip_max == r_hi
    # t0: r = r_hi, A = 1: on the upper bound -> loss -r_hi, grad -r_hi (not clipped)
    # t1: r = r_lo, A = -1: on the lower bound -> loss r_lo, grad r_lo (not clipped)
    # t2: just past the upper bound, A = 1 -> clipped, grad 0; t3: just past the lower bound, A = -1 -> 0
    d = [[0.25, -0.25, 0.2501, -0.2501]]
    adv = [[1.0, -1.0, 1.0, -1.0]]
    loss, maps, grad = run("ppo_clip", d, adv, [[1, 1, 1, 1]], params)
    torch.testing.assert_close(loss, torch.tensor([[-r_hi, r_lo, -r_hi, r_lo]], dtype=F64))
    torch.testing.assert_close(grad, torch.tensor([[-r_hi, r_lo, 0.0, 0.0]], dtype=F64))
    assert maps["clipped_fraction"].tolist() == [[0, 0, 1, 1]]


def test_ppo_dual_clip():
    # eps 0.2 / 0.2, c := e^1.1 = 3.004166 (so a ratio can sit exactly on it)
    #   t0: A = -1, r = e^1.5 = 4.481689 > c   -> loss min(max(4.48, 1.2), c) = c, dual clipped, grad 0
    #   t1: A = -1, r = e^0.9 = 2.459603 < c   -> loss 2.459603, grad 2.459603 (not clipped)
    #   t2: A = +1, r = 4.481689 (dual clip only for A < 0) -> loss -1.2, clipped high, grad 0
    #   t3: A = -2, r exactly c -> loss 2c, grad 2c (on the bound: not clipped)
    c = math.exp(1.1)
    params = PolicyLossParams(ratio_clip_c=c)
    d = [[1.5, 0.9, 1.5, 1.1]]
    adv = [[-1.0, -1.0, 1.0, -2.0]]
    loss, maps, grad = run("ppo_clip", d, adv, [[1, 1, 1, 1]], params)
    e09 = math.exp(0.9)
    torch.testing.assert_close(loss, torch.tensor([[c, e09, -1.2, 2 * c]], dtype=F64))
    torch.testing.assert_close(grad, torch.tensor([[0.0, e09, 0.0, 2 * c]], dtype=F64))
    assert maps["dual_clipped_fraction"].tolist() == [[1, 0, 0, 0]]
    assert maps["clipped_fraction"].tolist() == [[1, 0, 1, 0]]


def test_ppo_dual_clip_value_with_round_c():
    # c = 3: A = -1, r = e^1.5 -> loss exactly 3
    loss, _, grad = run("ppo_clip", [[1.5]], [[-1.0]], [[1]], PolicyLossParams(ratio_clip_c=3.0))
    assert loss.item() == 3.0 and grad.item() == 0.0


# ---- gspo ----------------------------------------------------------------------------------------------
def test_gspo_sequence_ratio_and_per_sequence_clip():
    # eps 0.2 / 0.2
    # row 0: d (0.1, 0.3), A = 1: s = e^0.2 = 1.221403 > 1.2 -> every token -1.2, clipped, grad 0
    # row 1: d (0.3, -0.1, pad), A = 1: s = e^0.1 = 1.105171 -> tokens -1.105171, grad -A s = -1.105171
    # row 2: d (-0.5, -0.1), A = -1: s = e^-0.3 = 0.740818 < 0.8 -> tokens 0.8, clipped low, grad 0
    d = [[0.1, 0.3, 0.0], [0.3, -0.1, 9.0], [-0.5, -0.1, 0.0]]
    adv = [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [-1.0, -1.0, 0.0]]
    mask = [[1, 1, 0], [1, 1, 0], [1, 1, 0]]
    s1 = math.exp(0.1)
    loss, maps, grad = run("gspo", d, adv, mask, PolicyLossParams())
    torch.testing.assert_close(loss, torch.tensor([[-1.2, -1.2, 0], [-s1, -s1, 0], [0.8, 0.8, 0]], dtype=F64))
    torch.testing.assert_close(grad, torch.tensor([[0, 0, 0], [-s1, -s1, 0], [0, 0, 0]], dtype=F64))
    torch.testing.assert_close(maps["probs_ratio"][:, 0], torch.tensor([math.exp(0.2), s1, math.exp(-0.3)], dtype=F64))
    assert token_mean(maps, mask)["clipped_fraction"] == pytest.approx(4 / 6)


def test_gspo_gradient_equals_sequence_level_objective():
    # Reference: GSPO's sequence objective J = mean_i max(-A_i s_i, -A_i clip(s_i)), s_i = exp(mean_t(logp - old))
    # differentiated directly (no stop-gradient trick), against GSPO-token + seq_mean_token_mean.
    g = torch.Generator().manual_seed(0)
    b, t = 6, 5
    old = -torch.rand(b, t, generator=g, dtype=F64) * 2
    logprobs = (old + 0.3 * torch.randn(b, t, generator=g, dtype=F64)).requires_grad_(True)
    mask = torch.arange(t)[None, :] < torch.tensor([5, 3, 1, 4, 2, 5])[:, None]
    seq_adv = torch.randn(b, generator=g, dtype=F64)
    params = PolicyLossParams(ratio_clip_min=0.05, ratio_clip_max=0.08)
    loss, _ = POLICY_LOSSES.get("gspo")(logprobs, old, seq_adv[:, None].expand(b, t), mask, params)
    (grad,) = torch.autograd.grad(aggregate("seq_mean_token_mean", loss, mask, count_valid(mask)), logprobs)

    ref_lp = logprobs.detach().clone().requires_grad_(True)
    s = torch.exp(((ref_lp - old) * mask).sum(1) / mask.sum(1))
    j = torch.maximum(-seq_adv * s, -seq_adv * s.clamp(0.95, 1.08)).mean()
    (ref_grad,) = torch.autograd.grad(j, ref_lp)
    torch.testing.assert_close(grad, ref_grad, atol=1e-12, rtol=1e-9)
    assert (ref_grad != 0).any() and (ref_grad == 0).any()  # both regimes exercised


# ---- cispo / reinforce ---------------------------------------------------------------------------------
def test_cispo_truncates_the_weight_but_keeps_the_gradient():
    # cap 1 + 0.5 = 1.5, old = -1 so logp = -1 + d
    #   t0: r = e^0.1 = 1.105171, A = 1, logp -0.9  -> loss -1.105171 * 1 * -0.9 = 0.994654, grad -w A = -1.105171
    #   t1: r = e^0.7 = 2.013753 -> w = 1.5, A = 1, logp -0.3 -> loss 0.45, grad -1.5 (not stopped)
    #   t2: r = e^-1 = 0.367879, A = -2, logp -2 -> loss -0.367879 * -2 * -2 = -1.471518, grad 0.735759
    e01, em1 = math.exp(0.1), math.exp(-1.0)
    loss, maps, grad = run("cispo", [[0.1, 0.7, -1.0, 5.0]], [[1.0, 1.0, -2.0, 1.0]], [[1, 1, 1, 0]],
                           PolicyLossParams(cispo_clip_max=0.5))
    torch.testing.assert_close(loss, torch.tensor([[0.9 * e01, 0.45, -4 * em1, 0.0]], dtype=F64))
    torch.testing.assert_close(grad, torch.tensor([[-e01, -1.5, 2 * em1, 0.0]], dtype=F64))
    assert maps["clipped_high_fraction"].tolist() == [[0, 1, 0, 0]]
    torch.testing.assert_close(maps["probs_ratio_clamped"][0, :3], torch.tensor([e01, 1.5, em1], dtype=F64))


def test_reinforce_ignores_the_ratio():
    # loss -A logp: logp (-0.5, -2) with A (1, -0.5) -> (0.5, -1); grad -A = (-1, 0.5)
    loss, maps, grad = run("reinforce", [[0.5, -1.0, 3.0]], [[1.0, -0.5, 1.0]], [[1, 1, 0]], PolicyLossParams())
    torch.testing.assert_close(loss, torch.tensor([[0.5, -1.0, 0.0]], dtype=F64))
    torch.testing.assert_close(grad, torch.tensor([[-1.0, 0.5, 0.0]], dtype=F64))
    assert maps["clipped_fraction"].sum() == 0


# ---- float64 gradient references -----------------------------------------------------------------------
def random_inputs(seed, b=4, t=6):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=F64) * 3
    logprobs = old + 0.4 * torch.randn(b, t, generator=g, dtype=F64)
    adv = torch.randn(b, t, generator=g, dtype=F64)
    mask = torch.arange(t)[None, :] < torch.tensor([6, 4, 1, 3])[:, None]
    return logprobs, old, adv, mask


@pytest.mark.parametrize(
    "name, params",
    [
        ("ppo_clip", PolicyLossParams()),
        ("ppo_clip", PolicyLossParams(ratio_clip_min=0.1, ratio_clip_max=0.28, ratio_clip_c=1.5)),
        ("reinforce", PolicyLossParams()),
    ],
)
def test_gradcheck_against_finite_differences(name, params):
    logprobs, old, adv, mask = random_inputs(1)
    fn = POLICY_LOSSES.get(name)
    counts = count_valid(mask)
    f = lambda lp: aggregate("token_mean", fn(lp, old, adv, mask, params)[0], mask, counts)  # noqa: E731
    assert torch.autograd.gradcheck(f, (logprobs.requires_grad_(True),), eps=1e-7, atol=1e-8)


def test_gspo_gradcheck_with_sequence_advantages():
    # With one advantage per sequence, GSPO-token's gradient is the true gradient of its value.
    logprobs, old, adv, mask = random_inputs(2)
    adv = adv[:, :1].expand_as(adv)
    counts = count_valid(mask)
    fn = POLICY_LOSSES.get("gspo")
    for agg in ("token_mean", "seq_mean_token_mean"):
        f = lambda lp: aggregate(agg, fn(lp, old, adv, mask, PolicyLossParams())[0], mask, counts)  # noqa: E731
        assert torch.autograd.gradcheck(f, (logprobs.clone().requires_grad_(True),), eps=1e-7, atol=1e-8)


def test_cispo_gradient_against_frozen_weight_finite_differences():
    # CISPO's gradient is that of -sum_t w_t A_t logp_t with w frozen at the current point (stop-gradient).
    logprobs, old, adv, mask = random_inputs(3)
    params = PolicyLossParams(cispo_clip_max=0.1)
    counts = count_valid(mask)
    lp = logprobs.clone().requires_grad_(True)
    loss, _ = POLICY_LOSSES.get("cispo")(lp, old, adv, mask, params)
    (grad,) = torch.autograd.grad(aggregate("token_mean", loss, mask, counts), lp)
    w0 = torch.exp(logprobs - old).clamp(max=1.1)
    surrogate = lambda x: (-(w0 * adv * x) * mask).sum() / counts.valid_tokens  # noqa: E731
    h, fd = 1e-6, torch.zeros_like(logprobs)
    for idx in torch.cartesian_prod(torch.arange(4), torch.arange(6)).tolist():
        e = torch.zeros_like(logprobs)
        e[tuple(idx)] = h
        fd[tuple(idx)] = (surrogate(logprobs + e) - surrogate(logprobs - e)) / (2 * h)
    torch.testing.assert_close(grad, fd, atol=1e-8, rtol=1e-6)
    assert (w0 * mask == 1.1).any()  # the cap is active somewhere
