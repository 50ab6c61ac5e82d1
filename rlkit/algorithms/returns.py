"""Discounted returns over rows whose mask has holes (multi-turn conversations).

In a conversation row the policy's tokens come in runs separated by the environment's messages
(``loss_mask`` True, False, True...). A return discounts by the *policy's* steps, not by positions: the
environment's tokens are not actions, so a reward after a 30-token tool result is worth as much to the token
before the result as to the token after it. With ``k(t)`` the index of position ``t`` among the row's
generated positions,

    G_t = sum over generated s >= t of gamma^(k(s) - k(t)) * r_s      (t generated; 0 elsewhere)

On a row without holes this is the usual per-token return. Rewards must sit on generated positions (the
multi-turn rollout puts each on the last token of the turn it answers); one elsewhere is an error, since it
could not be credited to any action without a convention.
"""

from __future__ import annotations

import torch
from torch import Tensor


def discounted_returns(token_rewards: Tensor, mask: Tensor, gamma: float = 1.0) -> Tensor:
    """``G`` ``[B, T]`` from ``token_rewards`` ``[B, T]`` and ``mask`` ``[B, T]`` bool (see the module
    docstring); 0 outside ``mask``. ``gamma`` in ``[0, 1]``."""
    if token_rewards.shape != mask.shape or token_rewards.dim() != 2:
        raise ValueError(f"token_rewards {tuple(token_rewards.shape)} and mask {tuple(mask.shape)} must both be [B, T]")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    mask = mask.bool()
    if (token_rewards[~mask] != 0).any():
        raise ValueError("a reward sits on a position outside the mask (a token the policy did not generate); put "
                         "each reward on a generated token, e.g. the last token of the turn it answers")
    rewards = token_rewards.detach()
    if gamma == 1.0:  # no discount: holes change nothing, the return is the reversed cumulative sum
        return torch.where(mask, rewards.flip(-1).cumsum(-1).flip(-1), 0.0)
    out = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in range(rewards.shape[1] - 1, -1, -1):  # holes carry the running return on, undiscounted
        running = torch.where(mask[:, t], rewards[:, t] + gamma * running, running)
        out[:, t] = torch.where(mask[:, t], running, 0.0)
    return out
