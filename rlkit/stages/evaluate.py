"""Evaluate stage: held-out accuracy with one (greedy by default) completion per prompt, sampled under the
training rollouts' generation settings (stop strings; temperature, top-p and top-k when not greedy)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from rlkit.envs import Environment
from rlkit.generation.base import Generator, SamplingSettings
from rlkit.stages.conversations import conversations, is_multi_turn
from rlkit.stages.rollout import rollout
from rlkit.stages.score import score
from rlkit.stages.settings import EvalSettings, ScoreSettings
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
    held_out_rows: Optional[int] = None  # held-out rows there were to choose from (None: not said)

    def __repr__(self) -> str:
        part = (f" of {self.held_out_rows} (eval.num_prompts)"
                if self.held_out_rows is not None and self.held_out_rows > self.num_prompts else "")
        return (f"EvalResult(accuracy={self.accuracy:.3f} on {self.num_prompts}{part} held-out prompts, "
                f"policy_version={self.policy_version})")


def evaluate(generator: Generator, tokenizer: Any, env: Environment, rows: Sequence[dict[str, Any]],
             policy_version: int, settings: EvalSettings, held_out_rows: Optional[int] = None) -> EvalResult:
    """Held-out accuracy on ``rows`` (chosen from ``held_out_rows`` held-out rows, if said); a multi-turn
    environment's conversations are played whole (within ``settings.rollout.max_total_tokens``, needed then), each
    scored by the sum of its turns' rewards."""
    t0 = time.perf_counter()
    sampling = SamplingSettings(temperature=0.0 if settings.greedy else settings.temperature, top_p=settings.top_p,
                                top_k=settings.top_k, max_new_tokens=settings.max_new_tokens,
                                stop_strings=settings.stop_strings, seed=settings.seed)
    rewards, batches = [], []
    for start in range(0, len(rows), settings.chunk):
        part = rows[start:start + settings.chunk]
        if is_multi_turn(env):
            part = conversations(generator, tokenizer, env, part, sampling, policy_version, settings.rollout)
        else:
            part = rollout(generator, tokenizer, part, sampling, policy_version, settings.rollout)
            part = score(part, env, ScoreSettings(max_failure_fraction=settings.rollout.max_failure_fraction))
        rewards += part.rewards.tolist()
        batches.append(part)
    accuracy = sum(r >= 1.0 for r in rewards) / len(rewards)
    return EvalResult(accuracy, sum(rewards) / len(rewards), len(rows), policy_version,
                      time.perf_counter() - t0, batches[0], held_out_rows)
