"""Per-token policy-gradient losses. Gradients flow through ``logprobs`` only.

Every loss has one signature (``PolicyLossFn``) and lives in ``POLICY_LOSSES``:

    fn(logprobs [B, T], old_logprobs [B, T], advantages [B, T], mask [B, T] bool, params)
        -> (per_token_loss [B, T], per_token_metrics: dict[str, Tensor [B, T]])

``per_token_loss`` is 0 outside ``mask``; reduce it with ``rlkit.algorithms.aggregation``. The metrics are
per-token maps (detached), the same keys for every loss (``POLICY_LOSS_METRICS``), so the caller can reduce
them with *global* counts and microbatch values add up: the token mean of ``clipped_fraction`` is the
fraction of tokens whose gradient the clip stopped (or, for CISPO, whose weight it truncated).

With ``r_t = exp(logp_t - old_t)``, ``eps_lo = ratio_clip_min``, ``eps_hi = ratio_clip_max``:

    ppo_clip   l_t = max(-A_t r_t, -A_t clip(r_t, 1 - eps_lo, 1 + eps_hi))        (Schulman et al. 2017)
               asymmetric eps_hi > eps_lo is DAPO's clip-higher (Yu et al. 2025); with ``ratio_clip_c``
               set, for A_t < 0: l_t = min(l_t, -A_t c) (dual clip, Ye et al. 2020)
    gspo       same clipped surrogate with the sequence ratio s_i = exp(mean_t (logp_t - old_t))
               (Zheng et al. 2025, GSPO), GSPO-token form: s_{i,t} = sg(s_i) * exp(logp_t - sg(logp_t))
    cispo      l_t = -sg(min(r_t, 1 + cispo_clip_max)) * A_t * logp_t              (MiniMax-M1, 2025)
    reinforce  l_t = -A_t * logp_t                                                 (Williams 1992)

A token is "clipped" where the clipped branch is active and stops its gradient: A > 0 and r > 1 + eps_hi,
A < 0 and r < 1 - eps_lo, or (dual clip) A < 0 and r > c. A ratio exactly on a bound is not clipped
(both branches agree there and the gradient flows).

Overflow guard (verl's convention): ``log r_t`` is clamped to ``[-20, 20]`` before ``exp`` and GSPO's
sequence log-ratio to ``<= 10``. Without it a log-ratio above ~89 makes ``exp`` inf in fp32: a clipped token
then gets a NaN gradient (``0 * inf`` through ``where``) and A < 0 an inf loss, and one such token ends the
step. Past the clamp the ratio is constant (``exp(20)``), so ppo_clip passes no gradient there; GSPO-token
and CISPO keep theirs, weighted by the clamped ratio. A log-ratio of 20 is already a ~5e8 ratio, far
outside any clip range, so values inside the usual range are unchanged.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from rlkit.algorithms.params import POLICY_LOSS_NAMES, PolicyLossParams
from rlkit.algorithms.registry import Registry

LOG_RATIO_CLAMP = 20.0  # |log r_t| bound before exp(); exp(20) ~ 4.9e8 stays finite in fp32 and bf16
GSPO_SEQ_LOG_RATIO_MAX = 10.0  # upper bound of GSPO's (length-normalised) sequence log-ratio
POLICY_LOSS_METRICS = (
    "probs_ratio",  # r_t (for gspo: the sequence ratio s_i on each token)
    "probs_ratio_clamped",  # the clipped ratio / IS weight actually used
    "clipped_fraction",  # any clip active
    "clipped_low_fraction",  # A < 0 and r < 1 - eps_lo
    "clipped_high_fraction",  # A > 0 and r > 1 + eps_hi (cispo: r > 1 + cispo_clip_max, any A)
    "dual_clipped_fraction",  # A < 0 and r > ratio_clip_c
)


PolicyLossFn = Callable[[Tensor, Tensor, Tensor, Tensor, PolicyLossParams], tuple[Tensor, dict[str, Tensor]]]
POLICY_LOSSES: Registry[PolicyLossFn] = Registry(POLICY_LOSS_NAMES)


def _masked_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:  # [B, T]
    # 0 on padding so exp() cannot overflow there (an inf would turn into NaN gradients through where()).
    return torch.where(mask, logprobs - old_logprobs.detach(), 0.0)


def _token_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:  # [B, T]
    """``r_t = exp(clamp(log r_t, -20, 20))``, 1 on padding: finite for any input (see the module docstring)."""
    return _masked_log_ratio(logprobs, old_logprobs, mask).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()


def _metrics(ratio: Tensor, clamped: Tensor, low: Tensor, high: Tensor, dual: Tensor) -> dict[str, Tensor]:
    return {
        "probs_ratio": ratio.detach(),
        "probs_ratio_clamped": clamped.detach(),
        "clipped_fraction": (low | high | dual).to(ratio.dtype),
        "clipped_low_fraction": low.to(ratio.dtype),
        "clipped_high_fraction": high.to(ratio.dtype),
        "dual_clipped_fraction": dual.to(ratio.dtype),
    }


def clipped_surrogate(
    ratio: Tensor, advantages: Tensor, mask: Tensor, params: PolicyLossParams
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's pessimistic clipped surrogate on any ratio ``[B, T]`` (shared by ``ppo_clip`` and ``gspo``).

    Written as ``-A * where(clipped, bound, r)`` rather than ``max(-A r, -A clip(r))``: the values are
    identical, but the gradient is then exactly the unclipped one on a bound (``torch.minimum`` would halve
    it at a tie with the dual-clip constant) and exactly 0 past it.
    """
    lo, hi, c = 1.0 - params.ratio_clip_min, 1.0 + params.ratio_clip_max, params.ratio_clip_c
    adv = advantages.detach()
    low = mask & (adv < 0) & (ratio < lo)  # pessimistic branch is the clipped ratio 1 - eps_lo
    high = mask & (adv > 0) & (ratio > hi)  # pessimistic branch is the clipped ratio 1 + eps_hi
    dual = mask & (adv < 0) & (ratio > c) if c is not None else torch.zeros_like(mask)  # -A r capped at -A c
    bound = torch.full_like(ratio, c if c is not None else 1.0).detach()
    bound = torch.where(low, lo, torch.where(high, hi, bound))
    clipped = low | high | dual
    loss = -adv * torch.where(clipped, bound, ratio)
    return torch.where(mask, loss, 0.0), _metrics(ratio, ratio.clamp(lo, hi), low, high, dual)


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip(
    logprobs: Tensor,  # [B, T], requires grad
    old_logprobs: Tensor,  # [B, T]
    advantages: Tensor,  # [B, T]
    mask: Tensor,  # [B, T] bool
    params: PolicyLossParams,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO/GRPO clipped ratio: ``max(-A r, -A clip(r, 1 - eps_lo, 1 + eps_hi))`` (+ dual clip)."""
    mask = mask.bool()
    ratio = _token_ratio(logprobs, old_logprobs, mask)
    return clipped_surrogate(ratio, advantages, mask, params)


@POLICY_LOSSES.register("gspo")
def gspo(
    logprobs: Tensor,  # [B, T], requires grad
    old_logprobs: Tensor,  # [B, T]
    advantages: Tensor,  # [B, T]
    mask: Tensor,  # [B, T] bool
    params: PolicyLossParams,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO (Zheng et al. 2025): the clipped surrogate on the length-normalised sequence ratio.

    ``s_i = exp(sum_t mask (logp_t - old_t) / |y_i|)``; each token uses the GSPO-token ratio
    ``s_{i,t} = sg(s_i) * exp(logp_t - sg(logp_t))`` (value ``s_i``, gradient ``s_i * grad logp_t``), so the
    clip decision is per sequence. For sequence-level advantages and any aggregation that weights the
    tokens of a sequence equally, the gradient equals the sequence-level GSPO gradient
    ``-A_i grad s_i = -A_i s_i mean_t grad logp_t``; use ``seq_mean_token_mean`` to match the paper's
    ``1 / G`` sequence average exactly.
    """
    mask = mask.bool()
    log_ratio = _masked_log_ratio(logprobs, old_logprobs, mask)
    seq_log_ratio = log_ratio.sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # [B]
    seq_log_ratio = seq_log_ratio.clamp(max=GSPO_SEQ_LOG_RATIO_MAX)  # exp() cannot overflow (module docstring)
    token_log_ratio = seq_log_ratio.detach()[:, None] + (logprobs - logprobs.detach())
    ratio = torch.where(mask, token_log_ratio, 0.0).exp()
    return clipped_surrogate(ratio, advantages, mask, params)


@POLICY_LOSSES.register("cispo")
def cispo(
    logprobs: Tensor,  # [B, T], requires grad
    old_logprobs: Tensor,  # [B, T]
    advantages: Tensor,  # [B, T]
    mask: Tensor,  # [B, T] bool
    params: PolicyLossParams,
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO (MiniMax-M1, 2025): ``-sg(min(r_t, 1 + cispo_clip_max)) * A_t * logp_t``.

    The IS weight is clipped and detached, so every token keeps a gradient (``-w_t A_t``); only its size
    is bounded. ``clipped_*`` count tokens whose weight was truncated (their gradient is *not* stopped).
    """
    mask = mask.bool()
    ratio = _token_ratio(logprobs, old_logprobs, mask)
    cap = 1.0 + params.cispo_clip_max
    weight = ratio.detach().clamp(max=cap)
    loss = -weight * advantages.detach() * logprobs
    high = mask & (ratio > cap)
    none = torch.zeros_like(mask)
    return torch.where(mask, loss, 0.0), _metrics(ratio, weight, none, high, none)


@POLICY_LOSSES.register("reinforce")
def reinforce(
    logprobs: Tensor,  # [B, T], requires grad
    old_logprobs: Tensor,  # [B, T]
    advantages: Tensor,  # [B, T]
    mask: Tensor,  # [B, T] bool
    params: PolicyLossParams,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Vanilla policy gradient (Williams 1992): ``-A_t * logp_t``; no ratio, no clip (on-policy only)."""
    mask = mask.bool()
    ratio = _token_ratio(logprobs, old_logprobs, mask)  # a metric only
    loss = -advantages.detach() * logprobs
    none = torch.zeros_like(mask)
    return torch.where(mask, loss, 0.0), _metrics(ratio, ratio, none, none, none)
