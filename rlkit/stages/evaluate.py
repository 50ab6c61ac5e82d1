"""Evaluate stage: held-out accuracy with one (greedy by default) completion per prompt."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from rlkit.envs import Environment
from rlkit.envs.base import MAX_REWARD_FAILURE_FRACTION
from rlkit.generation.base import Generator, SamplingSettings
from rlkit.stages.conversations import conversations, is_multi_turn
from rlkit.stages.rollout import rollout
from rlkit.stages.score import score
from rlkit.trajectories import Trajectories


@dataclass(frozen=True)
class EvalResult:
    """Held-out accuracy of one policy version, with the scored completions to look at."""

    accuracy: float  # fraction of prompts with reward >= 1 (exact match on the shipped tasks)
    mean_reward: float
    num_prompts: int
    policy_version: int
    seconds: float
    batch: Trajectories  # the scored completions, for inspection

    def __repr__(self) -> str:
        return (f"EvalResult(accuracy={self.accuracy:.3f} on {self.num_prompts} held-out prompts, "
                f"policy_version={self.policy_version})")


def evaluate(generator: Generator, tokenizer: Any, env: Environment, rows: Sequence[dict[str, Any]],
             max_new_tokens: int, policy_version: int, greedy: bool = True, seed: int = 0,
             system_prompt: Optional[str] = None, chunk: int = 256,
             max_failure_fraction: float = MAX_REWARD_FAILURE_FRACTION,
             max_total_tokens: Optional[int] = None) -> EvalResult:
    """Held-out accuracy; a multi-turn environment's conversations are played whole (within
    ``max_total_tokens``, needed then), each scored by the sum of its turns' rewards."""
    t0 = time.perf_counter()
    sampling = SamplingSettings(temperature=0.0 if greedy else 1.0, max_new_tokens=max_new_tokens, seed=seed)
    rewards, batches = [], []
    for start in range(0, len(rows), chunk):
        if is_multi_turn(env):
            if max_total_tokens is None:
                raise ValueError("evaluate: a multi-turn environment needs max_total_tokens (the engine's length)")
            part = conversations(generator, tokenizer, env, rows[start:start + chunk], 1, sampling, policy_version,
                                 max_total_tokens, system_prompt, max_failure_fraction=max_failure_fraction)
        else:
            part = rollout(generator, tokenizer, rows[start:start + chunk], 1, sampling, policy_version, system_prompt)
            part = score(part, env, max_failure_fraction=max_failure_fraction)
        rewards += part.rewards.tolist()
        batches.append(part)
    accuracy = sum(r >= 1.0 for r in rewards) / len(rewards)
    return EvalResult(accuracy, sum(rewards) / len(rewards), len(rows), policy_version,
                      time.perf_counter() - t0, batches[0])
