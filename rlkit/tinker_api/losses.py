"""Tinker's built-in losses as one rlkit loss function, so the Session's own ``loss()`` and ``train()`` compute them.

Every Tinker loss is a *sum* over the datums' tokens (no normalisation), of a per-token term that reads the
trainer's logprob ``lp`` of each target token and the datum's ``loss_fn_inputs``:

    cross_entropy        -w * lp                                      (w: "weights")
    importance_sampling  -A * exp(lp - q)                             (A: "advantages", q: the sampler's "logprobs")
    ppo                  -min(r * A, clip(r, lo, hi) * A), r = exp(lp - q)
    cispo                -sg(clip(r, lo, hi)) * lp * A                (sg: no gradient through the clipped ratio)

with ``lo`` / ``hi`` the ``loss_fn_config`` keys ``clip_low_threshold`` / ``clip_high_threshold`` (defaults 0.8 and
1.2). A batch made by :func:`rlkit.tinker_api.convert.datums_to_batch` carries the per-token coefficient (``w`` or
``A``) as its ``advantages``, ``q`` as its ``generator_logprobs`` and each row's loss name and config in its
``env_metadata``, so one :class:`TinkerLoss` serves a batch that mixes losses (two ``forward_backward`` calls
before one ``optim_step``): a sum of per-row sums is the sum, and summed gradients are the gradient of the sum.

Deliberate simplifications: ``dro``, ``gspo``, ``stable_reinforce`` and custom losses are not here (the service
answers them with a failed future that names them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import torch
from torch import Tensor

from rlkit.trajectories import LossCounts, Trajectories

LOSS_KEY = "tinker_loss"  # env_metadata key: the row's Tinker loss name
CONFIG_KEY = "tinker_loss_fn_config"  # env_metadata key: the row's loss_fn_config

# per-token term: (lp [b, T] with grad, q [b, T], coefficient [b, T], config) -> [b, T]
TokenLoss = Callable[[Tensor, Tensor, Tensor, Mapping[str, float]], Tensor]


def _clip_range(config: Mapping[str, float]) -> tuple[float, float]:
    return float(config.get("clip_low_threshold", 0.8)), float(config.get("clip_high_threshold", 1.2))


def cross_entropy(lp: Tensor, q: Tensor, w: Tensor, config: Mapping[str, float]) -> Tensor:
    return -w * lp


def importance_sampling(lp: Tensor, q: Tensor, a: Tensor, config: Mapping[str, float]) -> Tensor:
    return -a * torch.exp(lp - q)


def ppo(lp: Tensor, q: Tensor, a: Tensor, config: Mapping[str, float]) -> Tensor:
    low, high = _clip_range(config)
    ratio = torch.exp(lp - q)
    return -torch.minimum(ratio * a, ratio.clamp(low, high) * a)


def cispo(lp: Tensor, q: Tensor, a: Tensor, config: Mapping[str, float]) -> Tensor:
    low, high = _clip_range(config)
    return -torch.exp(lp - q).clamp(low, high).detach() * lp * a


TINKER_LOSSES: dict[str, TokenLoss] = {"cross_entropy": cross_entropy, "importance_sampling": importance_sampling,
                                       "ppo": ppo, "cispo": cispo}
# the loss_fn_inputs each loss reads besides target_tokens, and the one that is its per-token coefficient
LOSS_INPUTS: dict[str, tuple[str, ...]] = {"cross_entropy": ("weights",),
                                           "importance_sampling": ("logprobs", "advantages"),
                                           "ppo": ("logprobs", "advantages"), "cispo": ("logprobs", "advantages")}
COEFFICIENT = {"cross_entropy": "weights", "importance_sampling": "advantages", "ppo": "advantages",
               "cispo": "advantages"}


def elementwise_loss(logprobs: Tensor, batch: Trajectories) -> Tensor:
    """The per-token loss terms [b, T] of ``batch``'s rows, each by its own Tinker loss; 0 outside ``loss_mask``."""
    out = torch.zeros_like(logprobs)
    coefficient = batch.require("advantages", "the Tinker conversion")
    for name in sorted({meta[LOSS_KEY] for meta in batch.env_metadata}):
        rows = torch.tensor([meta[LOSS_KEY] == name for meta in batch.env_metadata])
        config = next(meta[CONFIG_KEY] for meta in batch.env_metadata if meta[LOSS_KEY] == name)
        terms = TINKER_LOSSES[name](logprobs[rows], batch.generator_logprobs[rows], coefficient[rows], config)
        out = out.index_put((rows.nonzero().flatten(),), terms)
    return torch.where(batch.loss_mask, out, 0.0)


@dataclass(frozen=True)
class TinkerLoss:
    """An rlkit loss function (:data:`rlkit.policy.base.LossFn`) computing each row's Tinker loss, summed.

    The sum needs no global counts: each microbatch's sum is its share of the batch's, so the metrics add up
    across microbatches as the contract asks."""

    def __call__(self, logprobs: Tensor, batch: Trajectories, counts: LossCounts) -> tuple[Tensor, dict[str, Tensor]]:
        loss = elementwise_loss(logprobs, batch).sum()
        return loss, {"loss": loss.detach()}

    def __repr__(self) -> str:
        return "TinkerLoss(per-row Tinker loss, summed over tokens)"
