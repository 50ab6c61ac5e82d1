"""rlkit.models.compare's logits check: a bound relative to the logits' scale holds float32 rounding at any scale
and still catches a mapping mistake. Against float64 references of real float32 arithmetic."""

import pytest
import torch

from rlkit.models.compare import logits_agreement

ABSOLUTE = 1e-4  # the bound the conversion checks held before


def head_logits(scale: float):
    """A model's last step, ``hidden @ head``, in float32 and in float64 (the reference), the head scaled so the
    largest |logit| is about ``scale``: [64, 1000] each, and the hidden states and head for a wrong mapping."""
    g = torch.Generator().manual_seed(0)
    hidden, head = torch.randn(64, 2048, generator=g), torch.randn(2048, 1000, generator=g) / 2048**0.5
    head = head * scale / (hidden.double() @ head.double()).abs().max().item()
    return hidden @ head, (hidden.double() @ head.double()).float(), hidden, head


@pytest.mark.parametrize("scale", [1.0, 40.0, 1000.0])
def test_float32_rounding_agrees_at_every_scale(scale):
    a, b, _, _ = head_logits(scale)
    agreement = logits_agreement(a, b)
    assert agreement.ok and agreement.scale == pytest.approx(scale, rel=1e-6), agreement
    assert agreement.max_abs_diff > 0  # the two really differ by float32 rounding
    if scale == 1000.0:  # the absolute bound would fail this for no fault: rounding grows with the logits
        assert agreement.max_abs_diff > ABSOLUTE


def test_a_real_models_error_passes_and_a_larger_ones_too():
    """SmolLM2-135M's measured fp32 error (9.1e-5 on logits up to 38: 2.4e-6 of the scale), and the same relative
    error on a model with 4x larger logits, which the absolute 1e-4 refused."""
    g = torch.Generator().manual_seed(1)
    for scale in (38.0, 152.0):
        b = torch.randn(2, 50, 500, generator=g, dtype=torch.float64)
        b = b * scale / b.abs().max()
        a = b + 2.4e-6 * b.abs().max() * torch.sign(torch.randn(b.shape, generator=g, dtype=torch.float64))
        agreement = logits_agreement(a, b)
        assert agreement.ok and agreement.max_abs_diff == pytest.approx(2.4e-6 * scale), agreement
    assert agreement.max_abs_diff > ABSOLUTE


@pytest.mark.parametrize("scale", [1.0, 40.0])
def test_a_wrong_mapping_fails_by_far(scale):
    """The head's input features in the wrong order (as gate and up swapped, or two heads' rows exchanged)."""
    a, b, hidden, head = head_logits(scale)
    swapped = torch.cat([head[1024:], head[:1024]])
    agreement = logits_agreement(hidden @ swapped, b)
    assert not agreement.ok and agreement.max_abs_diff > 100 * agreement.bound, agreement
    assert "OUTSIDE" in str(agreement)


def test_the_tiny_bound_is_no_looser_than_the_absolute_one():
    """On logits of size below 10 (every tiny model's) the bound is at most the old 1e-4; at size <= 1, 1e-5."""
    a, b, _, _ = head_logits(0.5)
    assert logits_agreement(a, b).bound == pytest.approx(1e-5)
    assert logits_agreement(*head_logits(9.0)[:2]).bound < ABSOLUTE


def test_shapes_must_match():
    with pytest.raises(ValueError, match="different shapes"):
        logits_agreement(torch.zeros(2, 3), torch.zeros(3, 2))
