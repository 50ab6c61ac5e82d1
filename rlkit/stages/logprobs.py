"""Logprobs stage: the trainer's logprobs of the rollout tokens (before any update), the frozen reference
policy's (skipped when nothing uses them), and how far the generator's logprobs are from the trainer's."""

from __future__ import annotations

import time
import warnings
from typing import Optional

import torch

from rlkit.algorithms import token_mult_prob_error
from rlkit.policy.base import Policy
from rlkit.trajectories import Trajectories


def logprobs(batch: Trajectories, policy: Policy, with_reference: bool = True,
             mismatch_warning_threshold: float = 1e-2) -> Trajectories:
    """Trajectories with ``prev_logprobs``, ``entropy`` and (if ``with_reference``) ``ref_logprobs``, all [B, T]
    and, like every per-token field, 0 outside the completion (the policy scores prompt tokens too).

    ``info["token_mult_prob_error"]`` is NeMo-RL's mismatch metric (1.0 = generator and trainer agree);
    a value past ``1 + mismatch_warning_threshold`` warns (stale weights, a wrong refit, bf16 drift).
    """
    t0 = time.perf_counter()
    scores = policy.logprobs(batch.input_ids, batch.attention_mask, with_entropy=True)
    t1 = time.perf_counter()
    ref = policy.reference_logprobs(batch.input_ids, batch.attention_mask).logprobs if with_reference else None
    t2 = time.perf_counter()
    mask = batch.loss_mask
    error = token_mult_prob_error(scores.logprobs, batch.generator_logprobs, mask)
    diff = (scores.logprobs - batch.generator_logprobs).abs()[mask]
    if error - 1.0 > mismatch_warning_threshold:
        stale = policy.version != batch.policy_version
        warnings.warn(
            f"generator and trainer logprobs disagree: token_mult_prob_error={error:.4f}"
            + (f" (the batch came from policy version {batch.policy_version}, the policy is at "
               f"{policy.version}: refit before rollout)" if stale else " with the same weights: check the refit"),
            stacklevel=2,
        )
    info = dict(batch.info, **{
        "timing/logprobs": t1 - t0,
        "timing/reference_logprobs": t2 - t1,
        "token_mult_prob_error": error,
        "logprob_abs_diff_max": float(diff.max()) if diff.numel() else 0.0,
        "logprob_abs_diff_mean": float(diff.mean()) if diff.numel() else 0.0,
    })
    return batch.with_(prev_logprobs=_on_completion(scores.logprobs, mask),
                       entropy=_on_completion(scores.entropy, mask), ref_logprobs=_on_completion(ref, mask), info=info)


def _on_completion(values: Optional[torch.Tensor], mask: torch.Tensor) -> Optional[torch.Tensor]:
    """``values`` [B, T] with prompt and padding positions set to 0 (the batch's padding convention)."""
    return None if values is None else torch.where(mask, values, 0.0)
