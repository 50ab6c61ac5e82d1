"""The per-token variant of :meth:`rlkit.policy.base.Policy.evaluate_loss`: the loss's metrics and, per token,
what it adds to the loss and why (ratio, clipped, advantage, KL), on any backend.

Why one function over the contract rather than one method per backend: the only backend-specific part is the
trainer's logprobs, which :meth:`~rlkit.policy.base.Policy.logprobs` already gives on every backend (Megatron,
DTensor, plain transformers, the Ray worker group, which returns the whole batch to the driver); the loss is then
evaluated once over the whole batch with its global counts, which is what the microbatched ``evaluate_loss`` sums
to. ``tests/policy/test_per_token.py`` checks the two agree on every in-process backend.

Deliberate simplification: the whole batch's ``[B, T]`` maps are built in one piece on the driver (a notebook's
batch, not a training run's largest).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from rlkit.algorithms.aggregation import count_valid
from rlkit.policy.base import LossFn, Policy
from rlkit.trajectories import Trajectories


@dataclass(frozen=True)
class TokenLoss:
    """A loss evaluated on a batch, whole and per token."""

    metrics: dict[str, float]  # as evaluate_loss returns them (global-batch values)
    values: dict[str, Tensor]  # name -> [B, T] float32, 0 outside loss_mask ("loss", "ratio", ... see RLLoss.per_token)


def trainer_logprobs(policy: Policy, batch: Trajectories) -> Tensor:
    """The trainer's logprobs [B, T] of the batch's tokens under the current weights (0 at position 0 and on
    padding)."""
    return policy.logprobs(batch.input_ids, batch.attention_mask).logprobs


@torch.no_grad()
def evaluate_loss_per_token(policy: Policy, batch: Trajectories, loss_fn: LossFn,
                            logprobs: Optional[Tensor] = None) -> TokenLoss:
    """``loss_fn`` on ``batch`` under the current weights, no gradient and no update: its metrics and per-token
    maps (``loss_fn.per_token``, e.g. :meth:`rlkit.algorithms.RLLoss.per_token`; a loss function without one gets
    its token ``loss`` map only if it returns per-token values, so just ``logprob`` here). ``logprobs`` [B, T]:
    the trainer's logprobs when the caller has them already (several losses on one batch share one forward)."""
    batch.require("advantages", "advantages()")
    logprobs = trainer_logprobs(policy, batch) if logprobs is None else logprobs
    logprobs = logprobs.to(batch.loss_mask.device) * batch.attention_mask
    counts = count_valid(batch.loss_mask)
    loss, metrics = loss_fn(logprobs, batch, counts)
    values = dict(loss_fn.per_token(logprobs, batch, counts)) if hasattr(loss_fn, "per_token") else {}
    values["logprob"] = torch.where(batch.loss_mask, logprobs, 0.0)
    return TokenLoss({k: float(v) for k, v in metrics.items()}, values)
