"""Tinker's built-in losses as one rlkit loss function, so the Session's own ``loss()`` and ``train()`` compute them.

Every Tinker loss is a *sum* over the datums' tokens (no normalisation), of a per-token term that reads the
trainer's logprob ``lp`` of each target token and the datum's ``loss_fn_inputs`` (Tinker's loss docs, SDK 0.38.0):

    cross_entropy        -w * lp                                      (w: "weights")
    importance_sampling  -A * exp(lp - q)                             (A: "advantages", q: the sampler's "logprobs")
    ppo                  -min(r * A, clip(r, lo, hi) * A), r = exp(lp - q)
    cispo                -sg(clip(r, lo, hi)) * lp * A                (sg: no gradient through the clipped ratio)
    dro                  -(lp * A - beta / 2 * (lp - q)^2)
    gspo                 -min(s_t * A, clip(s_t, lo, hi) * A),  s_t = sg(s) * exp(lp - sg(lp)),
                         s = exp(mean over the datum's M of (lp - q)),   M: the positions "sequence_ratio_mask" marks

``lo`` / ``hi`` are the ``loss_fn_config`` keys ``clip_low_threshold`` / ``clip_high_threshold``; ``beta`` is
``dro``'s. GSPO is Tinker's token-level variant (GSPO-token): every token carries its datum's sequence ratio as a
value and its own logprob's gradient, so per-token advantages still work. Note that ``dro``'s quadratic term has
no mask: a position the recipe pads with ``logprobs`` 0 and advantage 0 (a prompt token) still adds
``beta / 2 * lp^2``, as Tinker's formula says.

A batch made by :func:`rlkit.tinker_api.convert.datums_to_batch` carries the per-token coefficient (``w`` or
``A``) as its ``advantages``, ``q`` as its ``generator_logprobs`` and each row's loss name, config (and GSPO's
``sequence_ratio_mask``) in its ``env_metadata``, so one :class:`TinkerLoss` serves a batch that mixes losses (two
``forward_backward`` calls before one ``optim_step``): a sum of per-row sums is the sum, and summed gradients are
the gradient of the sum. GSPO's ratio is a per-row mean, so it too is the same whichever rows share a microbatch.

Deliberate simplifications: ``stable_reinforce`` is not here: its objective reads stability information Tinker's
sampler records at sampling time (``record_stability_info``, datum provenance) and Tinker's docs do not define it,
so the service answers it with a failed future that says so. Defaults are only those the docs state (``ppo`` and
``cispo``: 0.8 / 1.2); ``dro`` without ``beta`` and ``gspo`` without both clip thresholds are refused, naming the
key, rather than computed with a guessed default. Custom losses run on the client (the SDK sends them as
cross-entropy weights); a server-side custom loss (``"custom"``) is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import torch
from torch import Tensor

from rlkit.trajectories import LossCounts, Trajectories

LOSS_KEY = "tinker_loss"  # env_metadata key: the row's Tinker loss name
CONFIG_KEY = "tinker_loss_fn_config"  # env_metadata key: the row's loss_fn_config
RATIO_MASK_KEY = "tinker_sequence_ratio_mask"  # env_metadata key: gspo's sequence_ratio_mask, [N] bools


@dataclass(frozen=True)
class TokenInputs:
    """What a Tinker loss reads for some rows of a batch, in rlkit's positions (position 0 is no target)."""

    lp: Tensor  # [b, T] float32, the trainer's logprob of each target token, with grad
    q: Tensor  # [b, T] float32, the sampler's logprob ("logprobs"); 0 for cross_entropy
    coefficient: Tensor  # [b, T] float32, "weights" (cross_entropy) or "advantages"
    ratio_mask: Tensor  # [b, T] bool, gspo's sequence_ratio_mask; all False for the other losses
    config: Mapping[str, float]  # the loss_fn_config


TokenTerms = Callable[[TokenInputs], Tensor]  # -> [b, T] per-token loss terms


def _clip_range(config: Mapping[str, float]) -> tuple[float, float]:
    return float(config.get("clip_low_threshold", 0.8)), float(config.get("clip_high_threshold", 1.2))


def cross_entropy(x: TokenInputs) -> Tensor:
    return -x.coefficient * x.lp


def importance_sampling(x: TokenInputs) -> Tensor:
    return -x.coefficient * torch.exp(x.lp - x.q)


def ppo(x: TokenInputs) -> Tensor:
    low, high = _clip_range(x.config)
    ratio = torch.exp(x.lp - x.q)
    return -torch.minimum(ratio * x.coefficient, ratio.clamp(low, high) * x.coefficient)


def cispo(x: TokenInputs) -> Tensor:
    low, high = _clip_range(x.config)
    return -torch.exp(x.lp - x.q).clamp(low, high).detach() * x.lp * x.coefficient


def dro(x: TokenInputs) -> Tensor:
    beta = float(x.config["beta"])
    return -(x.lp * x.coefficient - 0.5 * beta * (x.lp - x.q) ** 2)


def gspo(x: TokenInputs) -> Tensor:
    low, high = float(x.config["clip_low_threshold"]), float(x.config["clip_high_threshold"])
    m = x.ratio_mask.to(x.lp.dtype)
    # the datum's sequence log-ratio, a value only: the mean token log-ratio over its marked positions
    log_ratio = ((x.lp.detach() - x.q) * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True)
    ratio = torch.exp(log_ratio + x.lp - x.lp.detach())  # s's value, each token's own gradient
    return -torch.minimum(ratio * x.coefficient, ratio.clamp(low, high) * x.coefficient)


TINKER_LOSSES: dict[str, TokenTerms] = {"cross_entropy": cross_entropy, "importance_sampling": importance_sampling,
                                        "ppo": ppo, "cispo": cispo, "dro": dro, "gspo": gspo}
_RL = ("logprobs", "advantages")
# the loss_fn_inputs each loss reads besides target_tokens, and the one that is its per-token coefficient
LOSS_INPUTS: dict[str, tuple[str, ...]] = {"cross_entropy": ("weights",), "importance_sampling": _RL, "ppo": _RL,
                                           "cispo": _RL, "dro": _RL, "gspo": (*_RL, "sequence_ratio_mask")}
COEFFICIENT = {name: "weights" if name == "cross_entropy" else "advantages" for name in TINKER_LOSSES}
# loss_fn_config keys a loss needs, because Tinker's loss docs state no default for them
REQUIRED_CONFIG: dict[str, tuple[str, ...]] = {"dro": ("beta",), "gspo": ("clip_low_threshold", "clip_high_threshold")}
NOT_SERVED = {
    "stable_reinforce": "its objective reads stability information that Tinker's sampler records "
                        "(record_stability_info, datum provenance), which Tinker's docs do not define",
    "custom": "server-side custom losses are not served; forward_backward_custom runs a custom loss on the client",
}


def _ratio_mask(batch: Trajectories, rows: Tensor, width: int) -> Tensor:
    """gspo's sequence_ratio_mask of ``batch``'s ``rows`` [b, width], in rlkit's positions (Tinker's i is i + 1)."""
    picked = [batch.env_metadata[i] for i in rows.nonzero().flatten().tolist()]
    out = torch.zeros((len(picked), width), dtype=torch.bool)
    for r, meta in enumerate(picked):
        marks = torch.tensor(meta.get(RATIO_MASK_KEY, ()), dtype=torch.bool)[:width - 1]
        out[r, 1:1 + len(marks)] = marks
    return out


def elementwise_loss(logprobs: Tensor, batch: Trajectories) -> Tensor:
    """The per-token loss terms [b, T] of ``batch``'s rows, each by its own Tinker loss; 0 outside ``loss_mask``."""
    out = torch.zeros_like(logprobs)
    coefficient = batch.require("advantages", "the Tinker conversion")
    # rows grouped by loss and config: two forward_backward calls of one loss may differ in their loss_fn_config
    keys = [(meta[LOSS_KEY], tuple(sorted(meta[CONFIG_KEY].items()))) for meta in batch.env_metadata]
    for name, items in sorted(set(keys)):
        rows, config = torch.tensor([key == (name, items) for key in keys]), dict(items)
        inputs = TokenInputs(lp=logprobs[rows], q=batch.generator_logprobs[rows], coefficient=coefficient[rows],
                             ratio_mask=_ratio_mask(batch, rows, logprobs.shape[1]), config=config)
        out = out.index_put((rows.nonzero().flatten(),), TINKER_LOSSES[name](inputs))
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
