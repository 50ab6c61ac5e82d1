"""Logprobs stage: the trainer's logprobs of the rollout tokens (before any update), the frozen reference
policy's (skipped when nothing uses them), and how far the generator's logprobs are from the trainer's."""

from __future__ import annotations

import warnings
from contextlib import nullcontext
from typing import Callable, ContextManager, Optional

import torch

from rlkit.algorithms import token_mult_prob_error
from rlkit.policy.base import Policy, TrainStepResult
from rlkit.trajectories import Trajectories


def logprobs(batch: Trajectories, policy: Policy, with_reference: bool = True,
             mismatch_warning_threshold: float = 1e-2,
             timed: Callable[[str], ContextManager] = lambda part: nullcontext()) -> Trajectories:
    """Trajectories with ``prev_logprobs``, ``entropy`` and (if ``with_reference``) ``ref_logprobs``, all [B, T]
    and, like every per-token field, 0 outside the completion (the policy scores prompt tokens too).

    ``info["token_mult_prob_error"]`` is NeMo-RL's mismatch metric (1.0 = generator and trainer agree);
    a value past ``1 + mismatch_warning_threshold`` warns (stale weights, a wrong refit, bf16 drift).
    ``timed("reference_logprobs")`` wraps the reference pass (the run's step clock: ``timing/reference_logprobs``).
    """
    mask = batch.loss_mask  # the completion: the only positions kept (a fused head computes no others)
    scores = policy.logprobs(batch.input_ids, batch.attention_mask, with_entropy=True, scored=mask)
    with timed("reference_logprobs"):
        ref = policy.reference_logprobs(batch.input_ids, batch.attention_mask, scored=mask).logprobs \
            if with_reference else None
    out = _with_trainer_logprobs(batch, scores.logprobs, scores.entropy, policy.version, mismatch_warning_threshold)
    return out.with_(ref_logprobs=_on_completion(ref, batch.loss_mask))


def logprobs_from_train_step(batch: Trajectories, step: TrainStepResult, version: int,
                             mismatch_warning_threshold: float = 1e-2) -> Trajectories:
    """The batch as :func:`logprobs` leaves it (``prev_logprobs``, ``entropy``, the mismatch figures), from a
    train step that computed them itself: the only update on a batch without ``prev_logprobs``, taken at
    policy ``version``, whose forward gives what the logprobs pass would have (``Policy.train_step``).
    ``Session.step()`` saves the separate pass this way when it can (:meth:`rlkit.Session.step`)."""
    if step.logprobs is None:
        raise ValueError("this train step returned no logprobs: its batch had prev_logprobs, or the policy does not "
                         "return them (Policy.returns_step_logprobs); run the logprobs stage before training")
    return _with_trainer_logprobs(batch, step.logprobs, step.entropy, version, mismatch_warning_threshold)


def _with_trainer_logprobs(batch: Trajectories, logprobs: torch.Tensor, entropy: Optional[torch.Tensor],
                           version: int, mismatch_warning_threshold: float) -> Trajectories:
    """``batch`` with the trainer's ``logprobs`` and ``entropy`` [B, T] taken at policy ``version``, and how far the
    generator's logprobs are from them (warns past the threshold)."""
    mask = batch.loss_mask
    error = token_mult_prob_error(logprobs, batch.generator_logprobs, mask)
    diff = (logprobs - batch.generator_logprobs).abs()[mask]
    if error - 1.0 > mismatch_warning_threshold:
        stale = version != batch.policy_version
        warnings.warn(
            f"generator and trainer logprobs disagree: token_mult_prob_error={error:.4f}"
            + (f" (the batch came from policy version {batch.policy_version}, the policy is at "
               f"{version}: refit before rollout)" if stale else " with the same weights: check the refit"),
            stacklevel=3,  # the line in rlkit.Session that ran the stage
        )
    info = dict(batch.info, **{
        "token_mult_prob_error": error,
        "logprob_abs_diff_max": float(diff.max()) if diff.numel() else 0.0,
        "logprob_abs_diff_mean": float(diff.mean()) if diff.numel() else 0.0,
    })
    return batch.with_(prev_logprobs=_on_completion(logprobs, mask), entropy=_on_completion(entropy, mask), info=info)


def _on_completion(values: Optional[torch.Tensor], mask: torch.Tensor) -> Optional[torch.Tensor]:
    """``values`` [B, T] with prompt and padding positions set to 0 (the batch's padding convention)."""
    return None if values is None else torch.where(mask, values, 0.0)
