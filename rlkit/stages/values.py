"""PPO's critic stages: the values of a batch's states (before advantages), and the critic's update on the GAE
returns (after the policy's train step).

``values`` fills ``batch.values`` [B, T] (0 outside the completion) from the critic
(:class:`rlkit.policy.critic.Critic`); the ``gae`` advantage estimator reads them. ``update_critic`` computes the
returns from the same rewards and values as the advantages were (``R_t = A_t + V_t`` before whitening,
:func:`rlkit.algorithms.returns.gae`) and takes one critic step on the clipped value loss.
"""

from __future__ import annotations

from typing import Any

from rlkit.algorithms import AdvantageParams
from rlkit.algorithms.advantages import outcome_token_rewards
from rlkit.algorithms.returns import gae
from rlkit.config.run import CriticConfig
from rlkit.stages.advantages import reward_kl
from rlkit.trajectories import Trajectories


def _need(critic: Any, settings: CriticConfig) -> Any:
    """The critic, reading the session's current ``critic.*`` settings; a clear error without one."""
    if critic is None:
        raise ValueError("this session has no critic: PPO with a value model needs critic.enabled=true and "
                         "grpo.advantage_estimator=gae (the `ppo` preset sets both)")
    critic.use(settings)
    return critic


def values(batch: Trajectories, critic: Any, settings: CriticConfig) -> Trajectories:
    """``batch`` with the critic's ``values`` [B, T] of the states before its completion tokens."""
    v = _need(critic, settings).values(batch.input_ids, batch.attention_mask, batch.loss_mask)
    return batch.with_(values=v)


def update_critic(batch: Trajectories, critic: Any, params: AdvantageParams,
                  settings: CriticConfig) -> dict[str, float]:
    """One critic step toward the GAE returns of ``batch`` (scored, with ``values``); its ``critic/`` metrics."""
    old = batch.require("values", "values()")
    mask = batch.loss_mask
    token_rewards = outcome_token_rewards(batch.require("rewards", "score()"), mask, params, reward_kl(batch, params),
                                          "gae")
    _, returns = gae(token_rewards, old, mask, params.gamma, params.gae_lambda)
    return _need(critic, settings).train_step(batch.input_ids, batch.attention_mask, mask, old, returns)
