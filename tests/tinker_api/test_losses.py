"""Tinker's losses as rlkit computes them, against values derived by hand, and a mixed batch: one TinkerLoss computes
each row's own loss, and the sum of rows is the loss of the whole (what lets optim_step train on the batches of
several forward_backward calls at once)."""

import math

import numpy as np
import pytest
import torch

from rlkit.tinker_api.convert import Datum, TinkerRequestError, datums_to_batch
from rlkit.tinker_api.losses import TinkerLoss, elementwise_loss


def batch_of(loss_fn, tokens, config=None, **inputs):
    datum = Datum(tuple(tokens[:-1]), {"target_tokens": np.array(tokens[1:]), **inputs})
    return datums_to_batch([datum], loss_fn, config or {}, pad_token_id=0, policy_version=0)


def test_each_loss_by_hand():
    lp = torch.tensor([[0.0, math.log(0.5), math.log(0.25), math.log(0.9)]])  # rlkit positions; 0 is the prompt's
    q = np.log(np.array([0.5, 0.5, 0.5], dtype=np.float32))
    a = np.array([1.0, -2.0, 3.0], dtype=np.float32)
    ce = batch_of("cross_entropy", [5, 6, 7, 8], weights=np.array([0.0, 1.0, 2.0], dtype=np.float32))
    assert elementwise_loss(lp, ce)[0, 1:].tolist() == pytest.approx([0.0, -math.log(0.25), -2 * math.log(0.9)])
    ratio = np.array([1.0, 0.5, 1.8])
    is_ = batch_of("importance_sampling", [5, 6, 7, 8], logprobs=q, advantages=a)
    assert elementwise_loss(lp, is_)[0, 1:].tolist() == pytest.approx((-ratio * a).tolist(), rel=1e-6)
    ppo = batch_of("ppo", [5, 6, 7, 8], logprobs=q, advantages=a)
    # min(r A, clip(r, 0.8, 1.2) A): 1*1; A<0 with r=0.5: min(-1, -1.6) = -1.6; A>0 with r=1.8: min(5.4, 3.6) = 3.6
    assert elementwise_loss(lp, ppo)[0, 1:].tolist() == pytest.approx([-1.0, 1.6, -3.6], rel=1e-6)
    wide = batch_of("ppo", [5, 6, 7, 8], {"clip_low_threshold": 0.1, "clip_high_threshold": 3.0}, logprobs=q,
                    advantages=a)
    assert elementwise_loss(lp, wide)[0, 1:].tolist() == pytest.approx((-ratio * a).tolist(), rel=1e-6)
    cispo = batch_of("cispo", [5, 6, 7, 8], logprobs=q, advantages=a)
    clipped = np.clip(ratio, 0.8, 1.2)
    expected = -clipped * lp[0, 1:].numpy() * a
    assert elementwise_loss(lp, cispo)[0, 1:].tolist() == pytest.approx(expected.tolist(), rel=1e-6)


def test_cispo_has_no_gradient_through_its_ratio():
    lp = torch.tensor([[0.0, math.log(0.5)]], requires_grad=True)
    batch = batch_of("cispo", [5, 6], logprobs=np.log(np.array([0.5], dtype=np.float32)),
                     advantages=np.array([2.0], dtype=np.float32))
    elementwise_loss(lp, batch).sum().backward()
    assert lp.grad[0, 1].item() == pytest.approx(-2.0)  # d/dlp of -sg(r) * lp * A at r = 1


def test_a_mixed_batch_sums_each_rows_own_loss():
    ce = batch_of("cross_entropy", [5, 6, 7], weights=np.array([1.0, 1.0], dtype=np.float32))
    rl = batch_of("importance_sampling", [5, 6, 7, 8], logprobs=np.zeros(3, dtype=np.float32),
                  advantages=np.ones(3, dtype=np.float32))
    from rlkit.trajectories import Trajectories
    both = Trajectories.concat([ce, rl])
    lp = -torch.rand(2, 4, generator=torch.Generator().manual_seed(0)) * both.attention_mask
    loss, metrics = TinkerLoss()(lp, both, None)
    alone = elementwise_loss(lp[:1, :3], ce).sum() + elementwise_loss(lp[1:], rl).sum()
    assert loss.item() == pytest.approx(alone.item(), abs=1e-6) and metrics["loss"].item() == loss.item()
    # by hand: the first row's cross-entropy, the second row's ratios exp(lp - 0) times advantage 1
    by_hand = -lp[0, 1:3].sum() - torch.exp(lp[1, 1:4]).sum()
    assert loss.item() == pytest.approx(by_hand.item(), abs=1e-6)


def test_datums_rlkit_cannot_score_are_refused_with_the_fix():
    with pytest.raises(TinkerRequestError, match="shifted by one"):
        datums_to_batch([Datum((1, 2, 3), {"target_tokens": np.array([9, 9, 9])})], "cross_entropy", {}, 0, 0)
    with pytest.raises(TinkerRequestError, match="needs loss_fn_inputs"):
        datums_to_batch([Datum((1, 2), {"target_tokens": np.array([2, 3])})], "ppo", {}, 0, 0)
    with pytest.raises(TinkerRequestError, match="'stable_reinforce' is not implemented.*record_stability_info"):
        datums_to_batch([Datum((1, 2), {"target_tokens": np.array([2, 3])})], "stable_reinforce", {}, 0, 0)


def test_dro_and_gspo_refuse_what_tinker_leaves_undefined():
    """No guessed defaults (Tinker's docs give dro's beta and gspo's thresholds none), no empty GSPO ratio."""
    rl = {"logprobs": np.zeros(3, dtype=np.float32), "advantages": np.ones(3, dtype=np.float32)}
    with pytest.raises(TinkerRequestError, match=r"'dro' needs loss_fn_config keys \['beta'\]"):
        batch_of("dro", [5, 6, 7, 8], **rl)
    with pytest.raises(TinkerRequestError, match="clip_low_threshold', 'clip_high_threshold"):
        batch_of("gspo", [5, 6, 7, 8], {"beta": 1.0}, sequence_ratio_mask=np.ones(3, dtype=np.float32), **rl)
    clips = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    with pytest.raises(TinkerRequestError, match=r"needs loss_fn_inputs \['sequence_ratio_mask'\]"):
        batch_of("gspo", [5, 6, 7, 8], clips, **rl)
    with pytest.raises(TinkerRequestError, match="sequence_ratio_mask marks no token"):
        batch_of("gspo", [5, 6, 7, 8], clips, sequence_ratio_mask=np.zeros(3, dtype=np.float32), **rl)
    with pytest.raises(TinkerRequestError, match="per-datum clip thresholds"):
        batch_of("ppo", [5, 6, 7, 8], clip_low_threshold=np.full(3, 0.5, dtype=np.float32), **rl)


# ---- dro and gspo against Tinker's documented formulas, computed independently in float64 --------------------------
# Tinker's docs (losses: dro, gspo), over one datum's N target positions, lp the trainer's logprobs, q the sampler's:
#   dro   loss = -sum_t (lp_t A_t - beta/2 (lp_t - q_t)^2)            dloss/dlp_t = -A_t + beta (lp_t - q_t)
#   gspo  s = exp(mean_{t in M} (lp_t - q_t)); loss = -sum_t min(s A_t, clip(s, lo, hi) A_t); each token's ratio has
#         s's value and its own logprob's gradient (d s_t / d lp_t = s), so dloss/dlp_t = -A_t s where the unclipped
#         branch is the min (s inside [lo, hi], or clipped against the advantage's sign), else 0.


def reference_dro(lp, q, a, beta):
    lp, q, a = (np.asarray(v, dtype=np.float64) for v in (lp, q, a))
    return float(-(lp * a - 0.5 * beta * (lp - q) ** 2).sum()), -a + beta * (lp - q)


def reference_gspo(lp, q, a, mask, low, high):
    lp, q, a = (np.asarray(v, dtype=np.float64) for v in (lp, q, a))
    marked = np.asarray(mask) != 0
    s = math.exp(float((lp - q)[marked].mean()))
    clipped = min(max(s, low), high)
    loss = float(-np.minimum(s * a, clipped * a).sum())
    unclipped_taken = (low <= s <= high) | (s * a <= clipped * a)
    return loss, np.where(unclipped_taken, -a * s, 0.0)


def rl_case(seed, n=12, spread=0.3, shift=0.0):
    rng = np.random.default_rng(seed)
    q = -rng.uniform(0.5, 4.0, n)
    lp = q + shift + rng.normal(0.0, spread, n)  # the trainer a little off the sampler, as after a step
    a = rng.normal(size=n)
    return lp.astype(np.float32), q.astype(np.float32), a.astype(np.float32)


def run_loss(loss_fn, lp, q, a, config, **extra):
    """The loss and d loss / d lp at the datum's positions, through TinkerLoss on a batch the service would build."""
    tokens = list(range(5, 5 + len(lp) + 1))
    batch = batch_of(loss_fn, tokens, config, logprobs=q, advantages=a, **extra)
    logprobs = torch.zeros(1, len(lp) + 1)
    logprobs[0, 1:] = torch.from_numpy(lp)
    logprobs.requires_grad_(True)
    loss, metrics = TinkerLoss()(logprobs, batch, None)
    loss.backward()
    assert metrics["loss"].item() == loss.item()
    terms = elementwise_loss(logprobs.detach(), batch)
    assert terms.sum().item() == pytest.approx(loss.item(), abs=1e-5)
    return float(loss.detach()), logprobs.grad[0, 1:].double().numpy(), logprobs.grad[0, 0].item()


@pytest.mark.parametrize("beta", [0.05, 1.0])
def test_dro_loss_and_gradient_are_tinkers_formula(beta):
    lp, q, a = rl_case(0)
    loss, grad, grad_at_prompt = run_loss("dro", lp, q, a, {"beta": beta})
    ref_loss, ref_grad = reference_dro(lp, q, a, beta)
    assert loss == pytest.approx(ref_loss, rel=1e-6, abs=1e-5)
    assert np.allclose(grad, ref_grad, rtol=1e-5, atol=1e-6)
    assert grad_at_prompt == 0.0  # rlkit's position 0 is no Tinker target


def test_dro_penalises_unmasked_positions_as_the_formula_says():
    """A prompt position padded with logprobs 0 and advantage 0 still adds beta/2 lp^2 (the formula has no mask)."""
    lp = np.array([-2.0, -1.0], dtype=np.float32)
    loss, grad, _ = run_loss("dro", lp, np.zeros(2, dtype=np.float32), np.zeros(2, dtype=np.float32), {"beta": 0.5})
    assert loss == pytest.approx(0.25 * (4.0 + 1.0))
    assert grad.tolist() == pytest.approx([0.5 * -2.0, 0.5 * -1.0])


@pytest.mark.parametrize("seed, shift, low, high, where", [
    (1, 0.0, 0.8, 1.2, "inside"),   # every token's gradient is -A s
    (2, 0.5, 0.8, 1.2, "above"),    # clipped: tokens with A > 0 get no gradient, those with A < 0 get -A s
    (3, -0.5, 0.8, 1.2, "below"),   # clipped: tokens with A < 0 get no gradient, those with A > 0 get -A s
    (4, 0.0, 0.9997, 1.0004, "outside"),  # the GSPO paper's narrow range (3e-4, 4e-4)
])
def test_gspo_loss_and_gradient_are_tinkers_formula(seed, shift, low, high, where):
    lp, q, a = rl_case(seed, spread=0.1, shift=shift)
    mask = np.zeros(len(lp), dtype=np.float32)
    mask[4:] = 1.0  # the sampled tokens; the first four (the prompt's) are outside the ratio but still in the sum
    s = math.exp(float((lp.astype(np.float64) - q)[4:].mean()))
    assert {"inside": low <= s <= high, "above": s > high, "below": s < low, "outside": not low <= s <= high}[where]
    loss, grad, _ = run_loss("gspo", lp, q, a, {"clip_low_threshold": low, "clip_high_threshold": high},
                             sequence_ratio_mask=mask)
    ref_loss, ref_grad = reference_gspo(lp, q, a, mask, low, high)
    assert loss == pytest.approx(ref_loss, rel=1e-5, abs=1e-5)
    assert np.allclose(grad, ref_grad, rtol=1e-5, atol=1e-6), (grad, ref_grad)
    if where != "inside":
        assert (ref_grad == 0).any() and (ref_grad != 0).any()  # the case reaches both branches


def test_gspo_ratio_is_the_geometric_mean_over_the_marked_tokens_only():
    """By hand: log-ratios 0.2 and -0.1 on the marked tokens, 5.0 on an unmarked one: s = exp(0.05) for all three."""
    q = np.array([-1.0, -1.0, -1.0], dtype=np.float32)
    lp = q + np.array([5.0, 0.2, -0.1], dtype=np.float32)
    a = np.array([1.0, 1.0, -1.0], dtype=np.float32)
    loss, grad, _ = run_loss("gspo", lp, q, a, {"clip_low_threshold": 0.5, "clip_high_threshold": 2.0},
                             sequence_ratio_mask=np.array([0.0, 1.0, 1.0], dtype=np.float32))
    s = math.exp(0.05)
    assert loss == pytest.approx(-(s + s - s), rel=1e-6)
    assert grad.tolist() == pytest.approx([-s, -s, s], rel=1e-6)


def test_rows_of_one_loss_with_different_configs_keep_their_own():
    """Two forward_backward calls of dro with different beta before one optim_step: each row its own beta."""
    lp, q, a = rl_case(4, n=4)
    rows = [batch_of("dro", [5, 6, 7, 8, 9], {"beta": beta}, logprobs=q, advantages=a) for beta in (0.1, 2.0)]
    from rlkit.trajectories import Trajectories
    both = Trajectories.concat(rows)
    logprobs = torch.zeros(2, 5)
    logprobs[:, 1:] = torch.from_numpy(lp)
    loss, _ = TinkerLoss()(logprobs, both, None)
    expected = reference_dro(lp, q, a, 0.1)[0] + reference_dro(lp, q, a, 2.0)[0]
    assert loss.item() == pytest.approx(expected, rel=1e-6)
