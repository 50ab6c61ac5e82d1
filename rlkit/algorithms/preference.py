"""Preference losses over pairs of responses to one prompt (DPO, robust DPO, IPO), as TRL's ``DPOTrainer`` (1.16,
the version bench/.venv-trl pins) computes them with its default reverse-KL scores.

For pair ``i`` with sequence logprobs ``c_i, r_i`` (chosen, rejected) under the policy and ``c0_i, r0_i`` under
the frozen reference, the margin is ``h_i = (c_i - r_i) - (c0_i - r0_i)`` and

    sigmoid (DPO)  loss_i = -log sigmoid(beta * h_i)
    robust         loss_i = (-(1 - eps) * log sigmoid(beta * h_i) + eps * log sigmoid(-beta * h_i)) / (1 - 2 * eps)
    ipo            loss_i = (h_i - 1 / (2 * beta)) ** 2, with each sequence logprob the *mean* over its tokens

(``eps``: label smoothing, the assumed fraction of flipped labels, for ``robust`` only; IPO's mean over tokens is
TRL's: each response's log-ratio divided by its completion tokens). An SFT term can be added to any of them:
``sft_weight`` times the token-mean negative logprob of the chosen responses (TRL's ``loss_type=[..., "sft"]`` with
``loss_weights``; the RPO recipe), which keeps the chosen responses likely while the margin grows. The implicit
rewards are ``beta * (c_i - c0_i)`` and ``beta * (r_i - r0_i)``; TRL logs
them as ``rewards/chosen``, ``rewards/rejected``, their difference as ``rewards/margins`` and the fraction with the
chosen one higher as ``rewards/accuracies``, and this module uses the same names.

Why a weight per token (:func:`dpo_token_weights`): a pair's loss needs both of its sequences, but the policy's train
step cuts a batch into microbatches (by rows, by token budget, across data-parallel ranks) that may part them. The
gradient of the mean pair loss is ``sum_t w[b, t] * d logprob[b, t]`` with ``w = d loss / d logprob`` evaluated at
the current weights; a loss of ``sum_t w * logprob`` with ``w`` held fixed has that same gradient row by row, whatever
the microbatches (:func:`rlkit.stages.dpo.dpo_step`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

PreferenceLossName = Literal["sigmoid", "robust", "ipo"]
PREFERENCE_LOSSES: tuple[PreferenceLossName, ...] = ("sigmoid", "robust", "ipo")


@dataclass(frozen=True)
class PreferenceLoss:
    """The per-pair losses and implicit rewards of N pairs, each [N]."""

    losses: Tensor
    chosen_rewards: Tensor  # beta * (c - c0), detached
    rejected_rewards: Tensor  # beta * (r - r0), detached

    def metrics(self) -> dict[str, float]:
        """The batch means under TRL's names (``loss``, ``rewards/chosen``, ``rewards/rejected``,
        ``rewards/margins``, ``rewards/accuracies``)."""
        margins = self.chosen_rewards - self.rejected_rewards
        return {"loss": float(self.losses.detach().mean()), "rewards/chosen": float(self.chosen_rewards.mean()),
                "rewards/rejected": float(self.rejected_rewards.mean()), "rewards/margins": float(margins.mean()),
                "rewards/accuracies": float((margins > 0).float().mean())}


def sequence_logprobs(token_logprobs: Tensor, mask: Tensor, mean: bool) -> Tensor:
    """Each row's sum (or mean, for IPO) of ``token_logprobs`` [B, T] over ``mask`` [B, T] -> [B]."""
    total = (token_logprobs * mask).sum(-1)
    return total / mask.sum(-1).clamp(min=1) if mean else total


def preference_loss(chosen: Tensor, rejected: Tensor, ref_chosen: Tensor, ref_rejected: Tensor, *, beta: float,
                    loss_type: PreferenceLossName = "sigmoid", label_smoothing: float = 0.0) -> PreferenceLoss:
    """The losses of N pairs from their sequence logprobs, each [N] (see the module docstring)."""
    if loss_type not in PREFERENCE_LOSSES:
        raise ValueError(f"unknown preference loss {loss_type!r}; choose one of {', '.join(PREFERENCE_LOSSES)}")
    if label_smoothing and loss_type != "robust":
        raise ValueError(f"label_smoothing={label_smoothing} is read by the 'robust' loss only (as TRL's); set "
                         f"loss_type='robust' or label_smoothing=0")
    margin = (chosen - rejected) - (ref_chosen - ref_rejected)
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * margin)
    elif loss_type == "robust":
        losses = ((-(1 - label_smoothing) * F.logsigmoid(beta * margin) + label_smoothing * F.logsigmoid(-beta * margin))
                  / (1 - 2 * label_smoothing))
    else:
        losses = (margin - 1 / (2 * beta)) ** 2
    return PreferenceLoss(losses, beta * (chosen - ref_chosen).detach(), beta * (rejected - ref_rejected).detach())


def dpo_token_weights(token_logprobs: Tensor, ref_token_logprobs: Tensor, mask: Tensor, *, beta: float,
                      loss_type: PreferenceLossName = "sigmoid", label_smoothing: float = 0.0,
                      sft_weight: float = 0.0) -> tuple[Tensor, PreferenceLoss]:
    """``d loss / d token_logprobs`` [2N, T] and the pairs' losses, for a batch whose first N rows are the chosen
    responses and last N the rejected ones, in the same pair order (policy and reference logprobs and the completion
    ``mask``, each [2N, T]); ``loss`` is the mean pair loss plus ``sft_weight`` times the chosen responses'
    token-mean negative logprob. The weights are 0 outside ``mask``."""
    if token_logprobs.shape[0] % 2:
        raise ValueError(f"a preference batch has 2N rows (N chosen, then N rejected); this one has "
                         f"{token_logprobs.shape[0]}")
    mean = loss_type == "ipo"
    with torch.enable_grad():
        logprobs = token_logprobs.detach().double().requires_grad_(True)
        seq = sequence_logprobs(logprobs, mask, mean)
        ref = sequence_logprobs(ref_token_logprobs.double(), mask, mean)
        n = seq.shape[0] // 2
        pairs = preference_loss(seq[:n], seq[n:], ref[:n], ref[n:], beta=beta, loss_type=loss_type,
                                label_smoothing=label_smoothing)
        loss = pairs.losses.mean()
        if sft_weight:
            loss = loss - sft_weight * logprobs[:n][mask[:n]].mean()
        (weights,) = torch.autograd.grad(loss, logprobs)
    return weights.float() * mask, pairs


def bradley_terry_loss(chosen_scores: Tensor, rejected_scores: Tensor, *, margin: Tensor | None = None,
                       center_coefficient: float | None = None) -> Tensor:
    """A reward model's loss on N pairs of scores [N], as TRL's ``RewardTrainer``: ``-log sigmoid(s_c - s_r - m)``
    averaged (``margin`` m per pair, 0 when None), plus ``center_coefficient * mean((s_c + s_r)^2)`` when set, which
    keeps the scores centred on 0."""
    diff = chosen_scores - rejected_scores - (0.0 if margin is None else margin)
    loss = -F.logsigmoid(diff).mean()
    if center_coefficient is not None:
        loss = loss + center_coefficient * ((chosen_scores + rejected_scores) ** 2).mean()
    return loss
