"""Score stage: the environment's rewards for each completion (single-turn: one env step).

Environments contain failures per sample (reward 0 and a message), so one odd completion never costs a
step. But when most samples fail, the reward itself is broken (a ``NameError`` typo, a missing column) and
training on the zeros would waste the run silently: above ``max_failure_fraction`` of the batch, or when
every sample fails, ``score`` raises ``RewardError`` with the first failure and its sample. Below it, a
warning with the count.
"""

from __future__ import annotations

import warnings

from rlkit.algorithms import overlong_reward_shaping
from rlkit.envs import Environment
from rlkit.envs.base import error_sample_index
from rlkit.errors import RewardError
from rlkit.stages.settings import ScoreSettings
from rlkit.trajectories import Trajectories

_SHOW_CHARS = 200  # of the failing sample's prompt and completion in the error


def score(batch: Trajectories, env: Environment, settings: ScoreSettings = ScoreSettings()) -> Trajectories:
    """Rewards [B] from ``env``; failed samples get 0 and their messages land in ``reward_errors``.

    With ``settings.overlong_buffer_length`` set, DAPO's soft overlong punishment is added to the rewards. More
    than ``settings.max_failure_fraction`` of the samples failing (or all of them) raises ``RewardError``.
    """
    conversations = [
        [{"role": "user", "content": p}, {"role": "assistant", "content": c}]
        for p, c in zip(batch.prompts, batch.completions)
    ]
    result = env.step(conversations, list(batch.row_of_sample))
    check_reward_failures(result.errors, batch, env.name, settings.max_failure_fraction)
    rewards = result.rewards.float().clone()
    if settings.overlong_buffer_length is not None:
        rewards = rewards + overlong_reward_shaping(batch.completion_lengths, settings.max_new_tokens,
                                                    settings.overlong_buffer_length, settings.overlong_penalty)
    info = dict(batch.info, **{"reward_errors": len(result.errors)})
    return batch.with_(rewards=rewards, reward_errors=tuple(result.errors), info=info,
                       env_metadata=tuple(result.metadata))


def check_reward_failures(errors: list[str], batch: Trajectories, env_name: str, max_fraction: float) -> None:
    """Raise ``RewardError`` (naming environment ``env_name``) when too many samples failed, warn with the count
    when some did."""
    failed, total = len(errors), batch.batch_size
    if not failed:
        return
    if failed < total and failed <= max_fraction * total:
        warnings.warn(f"{failed} of {total} sample(s) got reward 0 because the reward failed; "
                      f"first: {errors[0]}", stacklevel=3)
        return
    share = "every sample" if failed == total else f"{failed} of {total} samples (more than " \
        f"env.max_reward_failure_fraction={max_fraction})"
    raise RewardError(f"the reward of environment {env_name!r} failed on {share}, so this step would train on zero "
                      f"rewards.\nFirst failure: {errors[0]}\n{_sample_text(errors[0], batch)}"
                      "Fix: call the reward function by hand on one of these samples to see the traceback; if such "
                      "failures are expected, raise env.max_reward_failure_fraction (at most 1.0: only all samples "
                      "failing is an error).")


def _sample_text(message: str, batch: Trajectories) -> str:
    i = error_sample_index(message)
    if i is None or not 0 <= i < batch.batch_size:
        return ""
    clip = lambda s: repr(s if len(s) <= _SHOW_CHARS else s[:_SHOW_CHARS] + "...")  # noqa: E731
    return f"  sample {i}: prompt {clip(batch.prompts[i])}, completion {clip(batch.completions[i])}\n"
