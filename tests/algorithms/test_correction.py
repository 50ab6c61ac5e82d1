"""Off-policy corrections and NeMo-RL's token_mult_prob_error, hand-derived."""

import math

import pytest
import torch

from rlkit.algorithms import CORRECTIONS, CorrectionParams, token_mult_prob_error
from rlkit.trajectories import LossCounts

E05, EM05 = math.exp(0.5), math.exp(-0.5)  # 1.648721, 0.606531

# prev - gen = (0.5, -0.5, masked)
PREV = torch.tensor([[-1.0, -1.0, -1.0]])
GEN = torch.tensor([[-1.5, -0.5, -30.0]])
MASK = torch.tensor([[True, True, False]])


def test_none_gives_unit_weights():
    c = CORRECTIONS.get("none")(PREV, GEN, MASK, CorrectionParams())
    assert torch.equal(c.weights, torch.ones(1, 3))
    m = c.metrics(MASK)
    assert m["is_weight_mean"].item() == 1.0 and m["is_clipped_fraction"].item() == 0.0
    assert m["is_ratio_mean"].item() == pytest.approx((E05 + EM05) / 2, abs=1e-6)


def test_tis_truncates_at_cap():
    prev = PREV.clone().requires_grad_(True)
    c = CORRECTIONS.get("tis")(prev, GEN, MASK, CorrectionParams(tis_cap=1.5))
    # ratios (1.648721, 0.606531, padding 1) -> weights (1.5, 0.606531, 1)
    torch.testing.assert_close(c.weights, torch.tensor([[1.5, EM05, 1.0]]))
    assert c.clipped.tolist() == [[True, False, False]]
    assert not c.weights.requires_grad
    m = c.metrics(MASK)
    assert m["is_weight_mean"].item() == pytest.approx((1.5 + EM05) / 2, abs=1e-6)  # 1.053266
    assert m["is_clipped_fraction"].item() == 0.5
    # a weight exactly at the cap is not truncated: prev - gen = 0 -> ratio 1 = cap
    c = CORRECTIONS.get("tis")(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1, dtype=torch.bool), CorrectionParams(tis_cap=1.0))
    assert c.weights.item() == 1.0 and not c.clipped.any()


def test_seq_mask_drops_sequences_outside_bounds():
    # per-sequence mean of prev - gen: row 0: (0.5 - 0.5) / 2 = 0 -> rho 1 (kept)
    # row 1: 0.1 -> rho 1.105171 > 1.1 (dropped); row 2: -0.2 (one valid token) -> rho 0.818731 >= 0.8 (kept)
    # row 3: no valid tokens -> rho 1 (kept, contributes nothing)
    prev = torch.zeros(4, 2)
    gen = torch.tensor([[-0.5, 0.5], [-0.1, -0.1], [0.2, 7.0], [3.0, 3.0]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 0], [0, 0]], dtype=torch.bool)
    c = CORRECTIONS.get("seq_mask")(prev, gen, mask, CorrectionParams(seq_mask_low=0.8, seq_mask_high=1.1))
    assert c.weights.tolist() == [[1, 1], [0, 0], [1, 1], [1, 1]]
    assert c.clipped.tolist() == [[False, False], [True, True], [False, False], [False, False]]
    m = c.metrics(mask)  # 5 valid tokens: weights 1 + 1 + 0 + 0 + 1
    assert m["is_weight_mean"].item() == pytest.approx(3 / 5)
    assert m["is_clipped_fraction"].item() == pytest.approx(2 / 5)
    # bounds are inclusive: row 0 has rho exactly 1
    c = CORRECTIONS.get("seq_mask")(prev, gen, mask, CorrectionParams(seq_mask_low=1.0, seq_mask_high=1.0))
    assert c.weights[0].tolist() == [1, 1] and c.weights[2].tolist() == [0, 0]


def test_metrics_use_global_counts():
    c = CORRECTIONS.get("tis")(PREV, GEN, MASK, CorrectionParams(tis_cap=1.5))
    m = c.metrics(MASK, LossCounts(valid_tokens=8, valid_sequences=1, num_sequences=1))
    assert m["is_clipped_fraction"].item() == pytest.approx(1 / 8)


def test_token_mult_prob_error():
    # exp(|0.5|) = exp(|-0.5|) = 1.648721 on both valid tokens; the masked token (|29|) is ignored
    assert token_mult_prob_error(PREV, GEN, MASK) == pytest.approx(E05, abs=1e-6)
    # with the third token valid: (2 * 1.648721 + e^29) / 3
    assert token_mult_prob_error(PREV, GEN, torch.ones(1, 3, dtype=torch.bool)) == pytest.approx(
        (2 * E05 + math.exp(29.0)) / 3, rel=1e-5
    )
    assert token_mult_prob_error(PREV, PREV, MASK) == 1.0
    assert token_mult_prob_error(PREV, GEN, torch.zeros(1, 3, dtype=torch.bool)) == 1.0
