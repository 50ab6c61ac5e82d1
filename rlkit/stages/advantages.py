"""Advantages stage: per-token advantages from rewards with a registered estimator."""

from __future__ import annotations

import warnings
from typing import Optional, Union

from torch import Tensor

from rlkit.algorithms import AdvantageFn, AdvantageParams, DistillationParams, RunningBaseline, compute_advantages
from rlkit.algorithms import kl_penalty, teacher_advantages, zero_variance_group_fraction
from rlkit.trajectories import Trajectories

ZERO_VARIANCE_WARNING = 0.9  # warn when this fraction of groups carries no learning signal


def advantages(batch: Trajectories, estimator: Union[str, AdvantageFn] = "grpo",
               params: AdvantageParams = AdvantageParams(), state: Optional[RunningBaseline] = None,
               distillation: Optional[DistillationParams] = None) -> Trajectories:
    """Trajectories with ``advantages`` [B, T] (0 outside the completion).

    Estimators that fold KL into the reward (REINFORCE++ with ``kl_coef``) need ``ref_logprobs``: run
    logprobs() first in that case. With ``distillation``: the teacher's per-token advantages (from
    ``teacher_logprobs``, :func:`rlkit.algorithms.teacher_advantages`) plus ``reward_weight`` x the estimator's
    (not computed at weight 0).
    """
    rewards = batch.require("rewards", "score()")
    with_env = distillation is None or distillation.reward_weight > 0
    adv = compute_advantages(estimator, rewards, batch.loss_mask, batch.group_size, params,
                             kl=reward_kl(batch, params), state=state, values=batch.values) if with_env else 0.0
    if distillation is not None:
        teacher = batch.require("teacher_logprobs", "teacher_logprobs()")
        adv = distillation.reward_weight * adv + teacher_advantages(batch.generator_logprobs, teacher,
                                                                    batch.loss_mask, distillation)
    zero_var = zero_variance_group_fraction(rewards, batch.group_size)
    if with_env and zero_var >= ZERO_VARIANCE_WARNING and batch.group_size > 1:
        warnings.warn(zero_variance_message(rewards, zero_var, batch.info), stacklevel=2)
    info = dict(batch.info, **{"zero_variance_groups": zero_var})
    return batch.with_(advantages=adv, info=info)


def reward_kl(batch: Trajectories, params: AdvantageParams) -> Optional[Tensor]:
    """The per-token k1 KL [B, T] (0 outside the completion) that ``params`` folds into the reward, or None."""
    if not params.kl_in_reward:
        return None
    prev = batch.require("prev_logprobs", "logprobs()")
    ref = batch.require("ref_logprobs", "logprobs() with a reference policy")
    return kl_penalty(prev, ref, "k1") * batch.loss_mask


def zero_variance_message(rewards: Tensor, zero_var: float, info: dict) -> str:  # rewards [B]
    """The warning for a batch whose prompt groups (``zero_var`` of them) have identical rewards, with what to do.

    Every sample at one reward of 0 or less (a reward never earned: a model that misses the answer format at
    temperature 1.0, e.g. 0 of 96 right) or at 1 or more (the task solved) is said with its fixes; otherwise the
    groups differ from one another and the generic words stand. A batch from dynamic sampling (``info`` has its
    rounds) names that setting's own knob rather than suggesting to turn it on."""
    head = f"{zero_var:.0%} of prompt groups have identical rewards"
    if zero_var < 1 or not bool((rewards == rewards[0]).all()):
        return f"{head} and give no gradient; the task may be too easy or too hard for the policy"
    value, n = float(rewards[0]), rewards.numel()
    if value >= 1:
        return (f"{head}: all {n} samples got reward {value:g}, so every advantage is 0 and no gradient flows this "
                "step. The task is solved or too easy for the policy: train on harder prompts, or stop here")
    if value > 0:
        return (f"{head}: all {n} samples got reward {value:g}, so every advantage is 0 and no gradient flows this "
                "step; the task may be too easy or too hard for the policy")
    tries = info.get("dynamic_sampling/tries")
    more = ("more dynamic sampling rounds (grpo.dynamic_sampling_max_gen_batches: its "
            f"{tries:g} found no group with varied rewards)" if tries is not None else
            "grpo.use_dynamic_sampling=true (skip groups with no reward variance and sample more prompts)")
    return (f"{head}: all {n} samples got reward {value:g} (none earned a reward), so every advantage is 0 and no "
            f"gradient flows this step. Fixes: {more}; a lower policy.generation.temperature (e.g. 0.7 for an "
            "instruct model, which sampling at 1.0 derails); more grpo.num_generations_per_prompt (more tries per "
            "prompt to find a rewarded one); or an SFT warm start (sft.enabled=true) on answers in the format the "
            "reward expects. Check the reward function on a few completions too")
