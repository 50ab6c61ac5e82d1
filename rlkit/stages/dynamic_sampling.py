"""DAPO dynamic sampling (Yu et al. 2025): keep only prompt groups whose rewards vary, and sample more
prompts until the batch is full.

A group whose G samples all got the same reward has zero advantage everywhere and adds nothing but
cost; filling the batch with informative groups keeps the effective batch size constant. Tries are
bounded: after ``max_tries`` rounds the batch is returned as it is (possibly short), and the shortfall is
reported in ``info``.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

import torch

from rlkit.algorithms import nonzero_variance_groups
from rlkit.trajectories import Trajectories


def dynamic_sampling(sample_and_score: Callable[[int], Trajectories], num_prompts: int,
                     max_tries: int) -> Trajectories:
    """``sample_and_score(try_index)`` returns a scored batch of fresh prompts; keep informative groups."""
    kept: list[Trajectories] = []
    have = dropped = tries = 0
    timings: Counter[str] = Counter()  # every round's stage seconds (timing/rollout, timing/score), summed
    while have < num_prompts and tries < max_tries:
        batch = sample_and_score(tries)
        tries += 1
        timings.update({key: seconds for key, seconds in batch.info.items() if key.startswith("timing/")})
        keep = nonzero_variance_groups(batch.require("rewards", "score()"), batch.group_size)
        groups = torch.nonzero(keep).flatten()[: num_prompts - have]
        dropped += int((~keep).sum())
        if len(groups):
            kept.append(batch.select_groups(groups))
            have += len(groups)
    if not kept:  # nothing informative at all: return the last batch so the step still runs (zero gradient)
        kept = [batch]
    out = Trajectories.concat(kept)
    info = dict(kept[0].info, **timings, **{"dynamic_sampling/tries": tries, "dynamic_sampling/dropped_groups": dropped,
                                 "dynamic_sampling/kept_groups": have,
                                 "dynamic_sampling/shortfall": max(0, num_prompts - have)})
    return out.with_(info=info)
