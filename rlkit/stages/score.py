"""Score stage: the environment's rewards for each completion (single-turn: one env step)."""

from __future__ import annotations

import time
import warnings

import torch

from rlkit.envs import Environment
from rlkit.trajectories import Trajectories


def score(batch: Trajectories, env: Environment, overlong_buffer_length: int | None = None,
          overlong_penalty: float = 1.0, max_new_tokens: int | None = None) -> Trajectories:
    """Rewards [B] from ``env``; failed samples get 0 and their messages land in ``reward_errors``.

    With ``overlong_buffer_length`` set, DAPO's soft overlong punishment is added to the rewards.
    """
    t0 = time.perf_counter()
    conversations = [
        [{"role": "user", "content": p}, {"role": "assistant", "content": c}]
        for p, c in zip(batch.prompts, batch.completions)
    ]
    result = env.step(conversations, list(batch.row_of_sample))
    rewards = result.rewards.float().clone()
    if overlong_buffer_length is not None:
        from rlkit.algorithms import overlong_reward_shaping

        rewards = rewards + overlong_reward_shaping(
            batch.completion_lengths, max_new_tokens, overlong_buffer_length, overlong_penalty
        )
    if result.errors:
        warnings.warn(f"{len(result.errors)} sample(s) got reward 0 because the reward failed; "
                      f"first: {result.errors[0]}", stacklevel=2)
    info = dict(batch.info, **{"timing/score": time.perf_counter() - t0, "reward_errors": len(result.errors)})
    return batch.with_(rewards=rewards, reward_errors=tuple(result.errors), info=info,
                       env_metadata=tuple(result.metadata))
