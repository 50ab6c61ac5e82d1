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
    with pytest.raises(TinkerRequestError, match="'dro' is not implemented"):
        datums_to_batch([Datum((1, 2), {"target_tokens": np.array([2, 3])})], "dro", {}, 0, 0)
