"""DAPO pieces (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale").

DAPO = GRPO + four changes. Two of them live elsewhere: clip-higher is ``ratio_clip_max > ratio_clip_min``
in ``losses.ppo_clip``, and the token-level loss is the ``token_mean`` aggregation. The other two are here
as pure functions the stages call:

- dynamic sampling keeps only prompts whose ``G`` rewards are not all equal (an all-equal group has zero
  group-relative advantage and only dilutes the batch): ``nonzero_variance_groups``;
- soft overlong punishment adds a length penalty that ramps linearly over the last ``buffer_len`` tokens
  before ``max_len``: ``overlong_reward_shaping``.

Deliberate simplification: over-sampling until the batch is full of informative groups is the rollout
stage's job; this module only says which groups to keep.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlkit.algorithms.advantages import _constant_groups, _grouped


def nonzero_variance_groups(rewards: Tensor, group_size: int) -> Tensor:  # [B] -> [N] bool
    """True for each prompt whose ``G`` rewards are not all equal (the groups dynamic sampling keeps).

    Expand to rows with ``keep.repeat_interleave(group_size)``. ``G = 1`` keeps nothing.
    """
    return ~_constant_groups(_grouped(rewards, group_size)).squeeze(1)


def overlong_reward_shaping(lengths: Tensor, max_len: int, buffer_len: int, penalty: float = 1.0) -> Tensor:
    """DAPO's soft overlong punishment ``R_length(|y|)``, to be *added* to the task reward (``[B]`` float).

        0                                          if |y| <= max_len - buffer_len
        ((max_len - buffer_len) - |y|) / buffer_len * penalty   if max_len - buffer_len < |y| <= max_len
        -penalty                                   if |y| > max_len

    ``lengths`` are completion lengths in tokens ``[B]``; the paper uses ``penalty = 1``.
    """
    if buffer_len <= 0 or buffer_len > max_len:
        raise ValueError(f"need 0 < buffer_len <= max_len, got buffer_len={buffer_len}, max_len={max_len}")
    length = lengths.detach().to(torch.float32)
    start = max_len - buffer_len
    ramp = (start - length) / buffer_len * penalty
    return torch.where(length <= start, 0.0, torch.where(length <= max_len, ramp, -float(penalty)))
