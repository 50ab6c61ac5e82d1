"""Aggregations with global counts: hand values, masking, and microbatch additivity."""

import pytest
import torch

from rlkit.algorithms import aggregate, count_valid
from rlkit.trajectories import LossCounts

VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]], dtype=torch.bool)  # row 2 fully masked


def test_count_valid():
    assert count_valid(MASK) == LossCounts(valid_tokens=5, valid_sequences=2, num_sequences=3)


@pytest.mark.parametrize(
    "name, constant, expected",
    [
        ("token_mean", None, 18 / 5),  # (1 + 2 + 4 + 5 + 6) / 5
        ("seq_mean_token_mean", None, 3.25),  # (1.5 + 5) / 2 valid sequences
        ("seq_sum_constant", 4.0, 1.5),  # 18 / (3 sequences * 4)
    ],
)
def test_values_and_microbatch_additivity(name, constant, expected):
    counts = count_valid(MASK)
    whole = aggregate(name, VALUES, MASK, counts, constant)
    assert whole.item() == pytest.approx(expected)
    parts = [aggregate(name, VALUES[i : i + 1], MASK[i : i + 1], counts, constant) for i in range(3)]
    assert sum(p.item() for p in parts) == pytest.approx(expected)
    assert parts[2].item() == 0.0  # the fully masked sequence contributes nothing


@pytest.mark.parametrize("name", ["token_mean", "seq_mean_token_mean", "seq_sum_constant"])
def test_padding_never_leaks_values_or_gradients(name):
    values = VALUES.clone()
    values[~MASK] = float("nan")
    values.requires_grad_(True)
    out = aggregate(name, values, MASK, count_valid(MASK), 4.0)
    out.backward()
    assert torch.isfinite(out)
    assert (values.grad[~MASK] == 0).all() and (values.grad[MASK] > 0).all()


def test_all_masked_gives_zero():
    mask = torch.zeros(2, 3, dtype=torch.bool)
    for name in ("token_mean", "seq_mean_token_mean", "seq_sum_constant"):
        assert aggregate(name, torch.ones(2, 3), mask, count_valid(mask), 4.0).item() == 0.0


def test_seq_sum_constant_needs_constant():
    with pytest.raises(ValueError, match="seq_sum_constant"):
        aggregate("seq_sum_constant", VALUES, MASK, count_valid(MASK))


def test_unknown_aggregation_lists_names():
    with pytest.raises(ValueError, match="'token_mean', 'seq_mean_token_mean', 'seq_sum_constant'"):
        aggregate("mean", VALUES, MASK, count_valid(MASK))
