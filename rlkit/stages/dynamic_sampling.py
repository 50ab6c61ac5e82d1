"""DAPO dynamic sampling (Yu et al. 2025): keep only prompt groups whose rewards vary, and sample more
prompts until the batch is full.

A group whose G samples all got the same reward has zero advantage everywhere and adds nothing but
cost; filling the batch with informative groups keeps the effective batch size constant. Tries are
bounded: after ``max_tries`` rounds the batch is returned as it is (possibly short), and the shortfall is
reported in ``info``.

The step's metrics of the kept groups (``rollout/reward_mean``) are chosen for their variance, so they are not a
learning curve: a policy that solves more prompts has more groups dropped as all-correct, and the kept groups'
mean stays near the middle. ``info`` therefore also carries what was sampled, kept or not (the step's metrics
take both, :func:`rlkit.run.loop.train`):

    rollout/reward_mean_all_sampled   mean reward over every sample of every round of the step, kept and dropped
                                      (the learning curve; the dashboard plots it when it is there)
    dynamic_sampling/kept_fraction    kept groups / sampled groups over the step's rounds (low: most groups
                                      had identical rewards, so most of the sampling was spent on nothing)
    dynamic_sampling/sampled_groups   prompt groups sampled over the step's rounds
"""

from __future__ import annotations

from typing import Callable

import torch

from rlkit.algorithms import nonzero_variance_groups
from rlkit.trajectories import Trajectories


def dynamic_sampling(sample_and_score: Callable[[int], Trajectories], num_prompts: int,
                     max_tries: int) -> Trajectories:
    """``sample_and_score(try_index)`` returns a scored batch of fresh prompts; keep informative groups."""
    kept: list[Trajectories] = []
    sampled: list[torch.Tensor] = []  # every round's rewards [N*G], kept or not
    have = dropped = tries = 0
    while have < num_prompts and tries < max_tries:
        batch = sample_and_score(tries)
        tries += 1
        rewards = batch.require("rewards", "score()")
        sampled.append(rewards)
        keep = nonzero_variance_groups(rewards, batch.group_size)
        groups = torch.nonzero(keep).flatten()[: num_prompts - have]
        dropped += int((~keep).sum())
        if len(groups):
            kept.append(batch.select_groups(groups))
            have += len(groups)
    if not kept:  # nothing informative at all: return the last batch so the step still runs (zero gradient)
        kept = [batch]
    out = Trajectories.concat(kept)
    all_rewards = torch.cat(sampled).float()
    sampled_groups = all_rewards.numel() // batch.group_size
    info = dict(kept[0].info, **{"dynamic_sampling/tries": tries, "dynamic_sampling/dropped_groups": dropped,
                                 "dynamic_sampling/kept_groups": have,
                                 "dynamic_sampling/shortfall": max(0, num_prompts - have),
                                 "dynamic_sampling/sampled_groups": sampled_groups,
                                 "dynamic_sampling/kept_fraction": have / sampled_groups,
                                 "rollout/reward_mean_all_sampled": float(all_rewards.mean())})
    return out.with_(info=info)
