"""Discounted returns, GAE and the value loss over rows whose mask has holes (multi-turn conversations).

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


def masked_whiten(values: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """``values`` [B, T] shifted to mean 0 and scaled to variance 1 over ``mask`` (the unbiased variance, as
    verl's ``masked_whiten``); positions outside ``mask`` come out shifted and scaled too (callers mask them)."""
    mask = mask.to(values.dtype)
    count = mask.sum()
    mean = (values * mask).sum() / count
    variance = (((values - mean) ** 2) * mask).sum() / count * (count / (count - 1))
    return (values - mean) * torch.rsqrt(variance + eps)


def gae(token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float = 1.0, lam: float = 1.0,
        whiten: bool = True) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation over [B, T] ``token_rewards`` and the critic's ``values`` (each token's
    value of the state before it), on the generated positions ``mask``; returns ``(advantages, returns)``, each
    [B, T] and 0 outside ``mask``.

        delta_t = r_t + gamma * V_next - V_t,   A_t = delta_t + gamma * lam * A_next,   R_t = A_t + V_t

    where ``next`` is the next *generated* position (the environment's tokens in a conversation, and padding, are
    skipped: neither a value nor a TD error there), as verl's ``compute_gae_advantage_return``. The returns are
    the value targets (before whitening); the advantages are whitened over ``mask`` when ``whiten``."""
    if not (token_rewards.shape == values.shape == mask.shape) or token_rewards.dim() != 2:
        raise ValueError(f"token_rewards {tuple(token_rewards.shape)}, values {tuple(values.shape)} and mask "
                         f"{tuple(mask.shape)} must all be [B, T]")
    on = mask.to(values.dtype)
    rewards, values = token_rewards.detach(), values.detach()
    next_value = torch.zeros_like(values[:, 0])
    running = torch.zeros_like(values[:, 0])
    advantages = torch.zeros_like(values)
    for t in range(values.shape[1] - 1, -1, -1):
        here = rewards[:, t] + gamma * next_value - values[:, t] + gamma * lam * running
        next_value = values[:, t] * on[:, t] + (1 - on[:, t]) * next_value
        running = here * on[:, t] + (1 - on[:, t]) * running
        advantages[:, t] = running
    returns = (advantages + values) * on
    if whiten:
        advantages = masked_whiten(advantages, mask)
    return advantages * on, returns


def clipped_value_loss(predicted: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip: float,
                       num_tokens: int) -> tuple[Tensor, Tensor]:
    """PPO's value loss over [B, T]: ``0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)`` summed over
    ``mask`` and divided by ``num_tokens`` (the global batch's, for microbatches; verl's ``compute_value_loss`` with
    token-mean aggregation); also the masked-token count where the clipped term is the larger (verl's
    ``vf_clipfrac`` numerator)."""
    clipped = old_values + (predicted - old_values).clamp(-clip, clip)
    unclipped_loss, clipped_loss = (predicted - returns) ** 2, (clipped - returns) ** 2
    per_token = torch.maximum(unclipped_loss, clipped_loss) * mask
    return 0.5 * per_token.sum() / max(num_tokens, 1), ((clipped_loss > unclipped_loss) & mask.bool()).sum()
