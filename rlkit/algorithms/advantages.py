"""Advantage estimators: sequence rewards ``[B]`` -> per-token advantages ``[B, T]``.

Every estimator has one signature (``AdvantageFn``) and lives in ``ADVANTAGE_ESTIMATORS``:

    fn(rewards [B], mask [B, T] bool, group_size G, cfg: AdvantageParams,
       kl: [B, T] | None = None, state: RunningBaseline | None = None) -> advantages [B, T]

``B = N * G`` with the ``G`` samples of a prompt contiguous (see ``rlkit.trajectories``). The result is
exactly 0 outside ``mask``. Advantages carry no gradient: inputs are used as values only.

Deliberate choices
- Group std is the *unbiased* (Bessel, ``G - 1``) std of the whole group, as NeMo-RL's
  ``calculate_baseline_and_std_per_prompt``. With ``use_leave_one_out_baseline`` NeMo-RL takes the std over
  the ``G - 1`` other samples; rlkit keeps the whole-group std so that both baselines share one scale.
- A group whose rewards are all equal gets advantage exactly 0 (a rounding residual in the mean would
  otherwise be divided by ``std + epsilon`` and blown up to a spurious nonzero advantage).
- ``G = 1`` gives advantage 0 for every group estimator (the baseline is the reward itself), never NaN.
- ``reinforce_baseline`` keeps a running mean in a ``RunningBaseline`` it mutates: the one documented
  exception to purity in this package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

import torch
from torch import Tensor

from rlkit.algorithms.params import ADVANTAGE_ESTIMATOR_NAMES, AdvantageEstimatorName, AdvantageParams
from rlkit.algorithms.registry import Registry
from rlkit.algorithms.returns import discounted_returns, gae


@dataclass
class RunningBaseline:
    """Mutable EMA of the batch-mean reward for ``reinforce_baseline``; keep one across steps."""

    value: Optional[float] = None  # None until the first batch
    updates: int = 0

    def update(self, batch_mean: float, momentum: float) -> None:
        """``b <- m * b + (1 - m) * mean(r)``; the first batch sets ``b = mean(r)``."""
        self.value = batch_mean if self.value is None else momentum * self.value + (1 - momentum) * batch_mean
        self.updates += 1


class AdvantageFn(Protocol):
    def __call__(
        self,
        rewards: Tensor,
        mask: Tensor,
        group_size: int,
        cfg: AdvantageParams,
        kl: Optional[Tensor] = None,
        state: Optional[RunningBaseline] = None,
    ) -> Tensor: ...


ADVANTAGE_ESTIMATORS: Registry[AdvantageFn] = Registry(ADVANTAGE_ESTIMATOR_NAMES)


def compute_advantages(
    estimator: AdvantageEstimatorName | AdvantageFn,
    rewards: Tensor,  # [B]
    mask: Tensor,  # [B, T] bool
    group_size: int,
    cfg: AdvantageParams = AdvantageParams(),
    kl: Optional[Tensor] = None,  # [B, T]
    state: Optional[RunningBaseline] = None,
    values: Optional[Tensor] = None,  # [B, T], a critic's (the estimators that read them: gae)
) -> Tensor:  # [B, T]
    """Look up ``estimator`` (a name or a callable) and apply it; ``values`` go to it only when given."""
    _check_shapes(rewards, mask, group_size)
    extra = {"values": values} if values is not None else {}
    return ADVANTAGE_ESTIMATORS.get(estimator)(rewards, mask, group_size, cfg, kl=kl, state=state, **extra)


# ---- group helpers -------------------------------------------------------------------------------------
def _check_shapes(rewards: Tensor, mask: Tensor, group_size: int) -> None:
    if rewards.ndim != 1 or mask.ndim != 2 or mask.shape[0] != rewards.shape[0]:
        raise ValueError(f"expected rewards [B] and mask [B, T]; got {tuple(rewards.shape)} and {tuple(mask.shape)}")
    _grouped(rewards, group_size)  # (every estimator's B, grouped or not, splits into groups of G)


def _grouped(rewards: Tensor, group_size: int) -> Tensor:  # [N, G] float
    if group_size < 1 or rewards.shape[0] % group_size:
        raise ValueError(f"batch of {rewards.shape[0]} rewards does not split into groups of {group_size}: "
                         "B must be num_prompts * group_size with each prompt's samples contiguous")
    r = rewards.detach()
    return (r if r.is_floating_point() else r.float()).view(-1, group_size)


def _constant_groups(r: Tensor) -> Tensor:  # [N, 1] bool: every reward of the group is equal
    return (r == r[:, :1]).all(dim=1, keepdim=True)


def _to_tokens(adv: Tensor, mask: Tensor) -> Tensor:  # [B] -> [B, T], exactly 0 outside the mask
    return torch.where(mask.bool(), adv.reshape(-1, 1), 0.0)


def group_stats(rewards: Tensor, group_size: int) -> tuple[Tensor, Tensor]:
    """Per-group mean ``[N]`` and unbiased std ``[N]`` (``sqrt(sum (r - mean)^2 / (G - 1))``).

    The std is exactly 0 for all-equal groups and for ``G = 1`` (where the unbiased std is undefined).
    """
    r = _grouped(rewards, group_size)
    mean = r.mean(dim=1)
    if group_size == 1:
        return mean, torch.zeros_like(mean)
    std = r.std(dim=1, correction=1)
    return mean, torch.where(_constant_groups(r).squeeze(1), torch.zeros_like(std), std)


def zero_variance_group_fraction(rewards: Tensor, group_size: int) -> float:
    """Fraction of prompts whose ``G`` rewards are all equal (they carry no group-relative signal)."""
    return _constant_groups(_grouped(rewards, group_size)).float().mean().item()


def _centred(r: Tensor, leave_one_out: bool) -> Tensor:  # [N, G] -> r - baseline, 0 for constant groups
    g = r.shape[1]
    if g == 1:
        return torch.zeros_like(r)
    if leave_one_out:  # RLOO: b_i = (sum_j r_j - r_i) / (G - 1)
        baseline = (r.sum(dim=1, keepdim=True) - r) / (g - 1)
    else:
        baseline = r.mean(dim=1, keepdim=True)
    return torch.where(_constant_groups(r), torch.zeros_like(r), r - baseline)


# ---- estimators ----------------------------------------------------------------------------------------
@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo(
    rewards: Tensor,  # [B]
    mask: Tensor,  # [B, T] bool
    group_size: int,
    cfg: AdvantageParams,
    kl: Optional[Tensor] = None,  # [B, T]
    state: Optional[RunningBaseline] = None,
) -> Tensor:  # [B, T]
    """GRPO (Shao et al. 2024, DeepSeekMath): ``A_i = (r_i - mean(r_group)) / (std(r_group) + eps)``.

    With ``use_leave_one_out_baseline`` the mean is over the other ``G - 1`` samples. Without
    ``normalize_rewards``, or for a group with std 0, the centred reward is returned unscaled.
    """
    r = _grouped(rewards, group_size)
    adv = _centred(r, cfg.use_leave_one_out_baseline)
    if cfg.normalize_rewards:
        std = group_stats(rewards, group_size)[1][:, None]  # [N, 1]
        adv = torch.where(std > 0, adv / (std + cfg.epsilon), adv)
    return _to_tokens(adv, mask)


@ADVANTAGE_ESTIMATORS.register("dr_grpo")
def dr_grpo(
    rewards: Tensor,  # [B]
    mask: Tensor,  # [B, T] bool
    group_size: int,
    cfg: AdvantageParams,
    kl: Optional[Tensor] = None,  # [B, T]
    state: Optional[RunningBaseline] = None,
) -> Tensor:  # [B, T]
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): ``A_i = r_i - mean(r_group)``.

    Dropping the std division removes GRPO's question-difficulty bias; pair it with the
    ``seq_sum_constant`` aggregation to also remove the length bias.
    """
    return _to_tokens(_centred(_grouped(rewards, group_size), leave_one_out=False), mask)


@ADVANTAGE_ESTIMATORS.register("rloo")
def rloo(
    rewards: Tensor,  # [B]
    mask: Tensor,  # [B, T] bool
    group_size: int,
    cfg: AdvantageParams,
    kl: Optional[Tensor] = None,  # [B, T]
    state: Optional[RunningBaseline] = None,
) -> Tensor:  # [B, T]
    """RLOO (Ahmadian et al. 2024, "Back to Basics"): ``A_i = r_i - (sum_{j != i} r_j) / (G - 1)``.

    Equivalently ``G / (G - 1) * (r_i - mean)``. No std scaling. ``G = 1`` gives 0.
    """
    return _to_tokens(_centred(_grouped(rewards, group_size), leave_one_out=True), mask)


def outcome_token_rewards(rewards: Tensor, mask: Tensor, cfg: AdvantageParams, kl: Optional[Tensor],
                          estimator: str) -> Tensor:  # [B] -> [B, T]
    """Each sample's reward on its last valid token, minus ``kl_coef * kl_t`` on every valid token when KL is
    folded into the reward; 0 outside ``mask`` (bool [B, T])."""
    b, t = mask.shape
    r = rewards.detach().float() if not rewards.is_floating_point() else rewards.detach()
    positions = torch.arange(t, device=mask.device).expand(b, t)
    last = torch.where(mask, positions, -1).max(dim=1).values  # [B], -1 for rows without tokens
    token_rewards = torch.zeros((b, t), dtype=r.dtype, device=r.device)
    rows = torch.nonzero(last >= 0).squeeze(1)
    token_rewards[rows, last[rows]] = r[rows]
    if cfg.kl_coef != 0.0:
        if kl is None:
            raise ValueError(f"{estimator} with kl_coef != 0 needs the per-token kl [B, T]: pass kl=...")
        token_rewards = token_rewards - cfg.kl_coef * torch.where(mask, kl.detach().to(r.dtype), 0.0)
    return token_rewards


@ADVANTAGE_ESTIMATORS.register("gae")
def gae_advantages(
    rewards: Tensor,  # [B]
    mask: Tensor,  # [B, T] bool
    group_size: int,
    cfg: AdvantageParams,
    kl: Optional[Tensor] = None,  # [B, T]
    state: Optional[RunningBaseline] = None,
    values: Optional[Tensor] = None,  # [B, T]: the critic's value of the state before each token
) -> Tensor:  # [B, T]
    """PPO's advantages from a learned critic: GAE (:func:`rlkit.algorithms.returns.gae`, verl's) over the outcome
    reward on each sample's last token (minus ``kl_coef * kl`` per token when set), with ``gamma`` and
    ``gae_lambda``, whitened over the batch's valid tokens. ``values`` come from the critic (``Session.values``)."""
    if values is None:
        raise ValueError("the gae estimator needs the critic's values [B, T]: run the values stage "
                         "(session.values(batch), which needs a critic: critic.enabled=true) before advantages")
    mask = mask.bool()
    advantages, _ = gae(outcome_token_rewards(rewards, mask, cfg, kl, "gae"), values, mask, cfg.gamma,
                        cfg.gae_lambda)
    return advantages


@ADVANTAGE_ESTIMATORS.register("reinforce_pp")
def reinforce_pp(
    rewards: Tensor,  # [B]
    mask: Tensor,  # [B, T] bool
    group_size: int,
    cfg: AdvantageParams,
    kl: Optional[Tensor] = None,  # [B, T]
    state: Optional[RunningBaseline] = None,
) -> Tensor:  # [B, T]
    """REINFORCE++ (Hu 2025): per-token return with KL in the reward, whitened over the whole batch.

    ``r_t = R * [t = last valid token] - kl_coef * kl_t`` (on valid tokens),
    ``G_t = sum_{s >= t} gamma^(k(s) - k(t)) r_s`` over valid tokens, ``k`` counting valid tokens (so a
    conversation's environment messages are not discounted over: :mod:`rlkit.algorithms.returns`),
    ``A_t = (G_t - mean(G)) / (std(G) + eps)`` where mean and
    std run over every valid token of the batch (population std, as OpenRLHF's masked whitening), not per
    group. ``kl`` ``[B, T]`` is the per-token KL estimate (see ``rlkit.algorithms.kl``); it is required
    when ``kl_coef != 0``. Without ``normalize_rewards`` the return is only mean-centred.
    """
    mask = mask.bool()
    token_rewards = outcome_token_rewards(rewards, mask, cfg, kl, "reinforce_pp")
    returns = discounted_returns(token_rewards, mask, cfg.gamma)
    valid = returns[mask]
    if valid.numel() == 0:
        return torch.zeros_like(returns)
    adv = returns - valid.mean()
    if cfg.normalize_rewards:
        std = valid.std(correction=0)
        adv = adv / (std + cfg.epsilon) if std > 0 else adv
    return torch.where(mask, adv, 0.0)


@ADVANTAGE_ESTIMATORS.register("reinforce_baseline")
def reinforce_baseline(
    rewards: Tensor,  # [B]
    mask: Tensor,  # [B, T] bool
    group_size: int,
    cfg: AdvantageParams,
    kl: Optional[Tensor] = None,  # [B, T]
    state: Optional[RunningBaseline] = None,
) -> Tensor:  # [B, T]
    """REINFORCE with a running-mean baseline (Williams 1992): ``A_i = r_i - b``.

    ``b`` is the EMA held in ``state`` *before* this batch (the first batch uses its own mean); the state
    is then updated with ``b <- m * b + (1 - m) * mean(r)``, ``m = baseline_momentum``. No std scaling.
    This estimator mutates ``state`` (the one exception to purity here), so re-running it moves the baseline.
    """
    if state is None:
        raise ValueError("reinforce_baseline keeps a running mean across steps: pass state=RunningBaseline() and "
                         "reuse it")
    r = _grouped(rewards, group_size).reshape(-1)
    batch_mean = r.mean().item()
    baseline = batch_mean if state.value is None else state.value
    adv = r - baseline
    state.update(batch_mean, cfg.baseline_momentum)
    return _to_tokens(adv, mask)
