"""Off-policy correction between the generator and the trainer.

The generator (vLLM, another precision, an older policy version in async runs) samples from ``mu``; the
loss's ``old`` policy is the trainer's ``pi_old`` (``Trajectories.prev_logprobs``). The importance ratio
``rho_t = pi_old(y_t) / mu(y_t) = exp(prev_t - gen_t)`` corrects for the mismatch. Each correction turns it
into per-token weights ``[B, T]`` (no gradient) that multiply the policy-gradient loss:

    none      w_t = 1
    tis       w_t = min(rho_t, tis_cap)                         token-level truncated IS
              (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training")
    seq_mask  w_t = 1 if seq_mask_low <= rho_seq <= seq_mask_high else 0, with
              rho_seq = exp(mean_t (prev_t - gen_t)) the per-token geometric mean of the sequence ratio
              (sequence-level masked IS; the length-normalised ratio keeps long sequences comparable)

``seq_mask`` drops a sequence rather than reweighting it: it removes samples the trainer would not have
produced, without the variance of a raw sequence-level ratio. Its kept sequences get weight 1.

``token_mult_prob_error`` is NeMo-RL's mismatch metric (``ClippedPGLossFn``): the mean over valid tokens of
``exp(|prev_t - gen_t|)``, 1.0 when generator and trainer agree exactly.

The correction's ``prev - gen`` is clamped to ``[-20, 20]`` before ``exp`` (verl's bound for its rollout IS
ratios): a token that far apart is a total mismatch either way, and the clamp keeps the weights and the
``is_*`` metrics finite in fp32 (``exp`` overflows past ~89). The weights never need more range: tis caps
them and seq_mask keeps only ratios near 1. ``token_mult_prob_error`` is not clamped (NeMo-RL's definition,
a detached metric): it may read inf, which no gradient sees, and which is loud enough.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

from rlkit.algorithms.losses import LOG_RATIO_CLAMP
from rlkit.algorithms.params import CORRECTION_NAMES, CorrectionParams
from rlkit.algorithms.registry import Registry
from rlkit.trajectories import LossCounts


@dataclass(frozen=True)
class Correction:
    """Per-token weights and which tokens the correction changed, both ``[B, T]`` without gradient."""

    weights: Tensor  # [B, T] float, multiplies the per-token policy-gradient loss
    ratio: Tensor  # [B, T] float, raw IS ratio exp(prev - gen)
    clipped: Tensor  # [B, T] bool, tokens whose weight was truncated (tis) or zeroed (seq_mask)

    def metrics(self, mask: Tensor, counts: Optional[LossCounts] = None) -> dict[str, Tensor]:
        """Token means over ``mask``, normalised by ``counts.valid_tokens`` (global) when given."""
        mask = mask.bool()
        n = max(counts.valid_tokens if counts is not None else int(mask.sum()), 1)
        token_sum = lambda x: torch.where(mask, x.float(), 0.0).sum() / n  # noqa: E731
        return {
            "is_weight_mean": token_sum(self.weights),
            "is_ratio_mean": token_sum(self.ratio),
            "is_clipped_fraction": token_sum(self.clipped),
        }


CorrectionFn = Callable[[Tensor, Tensor, Tensor, CorrectionParams], Correction]
CORRECTIONS: Registry[CorrectionFn] = Registry(CORRECTION_NAMES)


def _log_ratio(prev_logprobs: Tensor, generator_logprobs: Tensor, mask: Tensor) -> Tensor:  # [B, T]
    # 0 on padding, so exp() there is 1 and garbage padding values cannot overflow; clamped (module docstring).
    log_ratio = (prev_logprobs.detach() - generator_logprobs.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.where(mask.bool(), log_ratio, 0.0)


@CORRECTIONS.register("none")
def no_correction(
    prev_logprobs: Tensor, generator_logprobs: Tensor, mask: Tensor, params: CorrectionParams
) -> Correction:
    """``w_t = 1``: treat generator samples as if drawn from the trainer's old policy."""
    ratio = _log_ratio(prev_logprobs, generator_logprobs, mask).exp()
    return Correction(torch.ones_like(ratio), ratio, torch.zeros_like(mask, dtype=torch.bool))


@CORRECTIONS.register("tis")
def truncated_is(
    prev_logprobs: Tensor, generator_logprobs: Tensor, mask: Tensor, params: CorrectionParams
) -> Correction:
    """``w_t = min(exp(prev_t - gen_t), tis_cap)``; ``clipped`` marks tokens with ``rho_t > tis_cap``."""
    ratio = _log_ratio(prev_logprobs, generator_logprobs, mask).exp()
    weights = ratio.clamp(max=params.tis_cap)
    return Correction(weights, ratio, (ratio > params.tis_cap) & mask.bool())


@CORRECTIONS.register("seq_mask")
def sequence_mask(
    prev_logprobs: Tensor, generator_logprobs: Tensor, mask: Tensor, params: CorrectionParams
) -> Correction:
    """``w_t = [low <= exp(mean_t(prev_t - gen_t)) <= high]``, one decision per sequence.

    A sequence without valid tokens has ``rho_seq = 1`` and is kept (it contributes nothing anyway).
    """
    mask = mask.bool()
    log_ratio = _log_ratio(prev_logprobs, generator_logprobs, mask)
    seq_ratio = (log_ratio.sum(dim=1) / mask.sum(dim=1).clamp(min=1)).exp()  # [B]
    keep = (seq_ratio >= params.seq_mask_low) & (seq_ratio <= params.seq_mask_high)  # [B]
    weights = keep.to(log_ratio.dtype)[:, None].expand_as(log_ratio)
    return Correction(weights, log_ratio.exp(), ~keep[:, None] & mask)


def mult_prob_error_sum(prev_logprobs: Tensor, generator_logprobs: Tensor, mask: Tensor) -> Tensor:  # 0-dim
    """``sum_t mask_t * exp(|prev_t - gen_t|)``; divide by a (global) valid-token count for the mean."""
    err = (prev_logprobs.detach() - generator_logprobs.detach()).abs().exp()
    return torch.where(mask.bool(), err, 0.0).sum()


def token_mult_prob_error(
    prev_logprobs: Tensor,  # [B, T] trainer logprobs before the update
    generator_logprobs: Tensor,  # [B, T]
    mask: Tensor,  # [B, T] bool
) -> float:
    """NeMo-RL's ``token_mult_prob_error = sum_t mask_t * exp(|prev_t - gen_t|) / sum_t mask_t``.

    1.0 means generator and trainer agree exactly; ~1.01 is typical of a healthy bf16 run. A batch
    without valid tokens gives 1.0 (nothing disagrees).
    """
    n = int(mask.bool().sum())
    return mult_prob_error_sum(prev_logprobs, generator_logprobs, mask).item() / n if n else 1.0
