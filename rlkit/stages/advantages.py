"""Advantages stage: per-token advantages from rewards with a registered estimator."""

from __future__ import annotations

import time
import warnings
from typing import Optional, Union

from rlkit.algorithms import AdvantageFn, AdvantageParams, RunningBaseline, compute_advantages, kl_penalty
from rlkit.algorithms import zero_variance_group_fraction
from rlkit.trajectories import Trajectories

ZERO_VARIANCE_WARNING = 0.9  # warn when this fraction of groups carries no learning signal


def advantages(batch: Trajectories, estimator: Union[str, AdvantageFn] = "grpo",
               params: AdvantageParams = AdvantageParams(), state: Optional[RunningBaseline] = None) -> Trajectories:
    """Trajectories with ``advantages`` [B, T] (0 outside the completion).

    Estimators that fold KL into the reward (REINFORCE++ with ``kl_coef``) need ``ref_logprobs``: run
    logprobs() first in that case.
    """
    t0 = time.perf_counter()
    rewards = batch.require("rewards", "score()")
    kl = None
    if params.kl_in_reward:
        prev = batch.require("prev_logprobs", "logprobs()")
        kl = kl_penalty(prev, batch.require("ref_logprobs", "logprobs() with a reference policy"), "k1") * batch.loss_mask
    adv = compute_advantages(estimator, rewards, batch.loss_mask, batch.group_size, params, kl=kl, state=state)
    zero_var = zero_variance_group_fraction(rewards, batch.group_size)
    if zero_var >= ZERO_VARIANCE_WARNING and batch.group_size > 1:
        warnings.warn(f"{zero_var:.0%} of prompt groups have identical rewards and give no gradient; "
                      "the task may be too easy or too hard for the policy", stacklevel=2)
    info = dict(batch.info, **{"timing/advantages": time.perf_counter() - t0, "zero_variance_groups": zero_var})
    return batch.with_(advantages=adv, info=info)
