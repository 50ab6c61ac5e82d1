"""Logits of two implementations of one model, compared with a bound relative to the logits' scale.

Why relative: fp32 rounding grows with the size of the numbers summed, so an absolute bound that holds for a
tiny random model (logits of order 1, errors ~5e-7) is nearly reached by a real 135M model (logits up to ~40,
errors ~9e-5) for no fault. ``max|a - b| <= relative_bound * max(1, max|b|)`` keeps the tiny models' bound as
tight as before (their scale is about 1) and scales with real ones. Wrong mappings are far outside it (a plain
[Q;K;V] fuse: 0.5; gate/up swapped: 3e-2; a wrong RoPE base: 4e-3, on logits of order 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (annotations only: the config's checks load this module, which needs no torch)
    import torch

DEFAULT_RELATIVE_BOUND = 1e-5  # fp32: ~100x the rounding seen at 135M (9.1e-5 / 38 = 2.4e-6 relative), 20x at 1M


@dataclass(frozen=True)
class LogitsAgreement:
    """How far two logits tensors are apart, next to the bound they were held to."""

    max_abs_diff: float
    scale: float  # max |reference logit|
    bound: float  # relative_bound * max(1, scale)

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= self.bound

    def as_dict(self) -> dict:
        return {"max_abs_diff": self.max_abs_diff, "scale": self.scale, "bound": self.bound, "ok": self.ok}

    def __str__(self) -> str:
        verdict = "within" if self.ok else "OUTSIDE"
        return (f"max |logit diff| {self.max_abs_diff:.2e} {verdict} the bound {self.bound:.2e} "
                f"(relative to the largest |logit| {self.scale:.3g})")


def logits_agreement(actual: torch.Tensor, reference: torch.Tensor,
                     relative_bound: float = DEFAULT_RELATIVE_BOUND) -> LogitsAgreement:
    """``actual`` against ``reference`` (same shape, any float dtype; compared in float64)."""
    if actual.shape != reference.shape:
        raise ValueError(f"logits of different shapes: {tuple(actual.shape)} and {tuple(reference.shape)}")
    a, b = actual.detach().double(), reference.detach().double()
    scale = float(b.abs().max()) if b.numel() else 0.0
    return LogitsAgreement(float((a - b).abs().max()) if a.numel() else 0.0, scale,
                           relative_bound * max(1.0, scale))
