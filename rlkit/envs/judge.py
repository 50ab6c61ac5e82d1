"""LLM-as-judge: a generative model scores each completion from a prompt template; and weighted lists of rewards.

:class:`JudgeEnvironment` fills ``template`` for each sample (``{prompt}``, ``{completion}`` and any column of
the row, e.g. ``{answer}``), asks the judge for all of them in one batch call, and parses each reply with
``parse_score`` into a reward. The judge is any ``list[str] -> list[str]`` batch function: the policy's own
engine or a second model folder in its own engine, made by :func:`rlkit.generation.judge.engine_judge`, or a
remote API of yours. A reply the parser cannot read (or a judge call that raises) is that sample's failure,
counted as a reward failure: reward 0 and a message, and when every sample fails (or more than
``env.max_reward_failure_fraction``), ``score`` raises ``RewardError`` as for any reward.

:class:`WeightedRewards` is a single-turn environment made of components (environments or TRL-style reward
functions) and weights: the reward is ``sum(weight * component reward)``; each component's reward is kept in the
sample's metadata (``reward_components``), logged per step as ``rollout/reward/<name>_mean``. A sample whose
component failed gets 0 from that component, and the failure message is prefixed with the component's name.

Deliberate simplifications: the judge's reply is parsed, never constrained (no grammar-guided decoding); weighted
components are single-turn (a multi-turn environment plays conversations; put the judge on its final answer by
subclassing its ``answer_reward``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union


from rlkit.envs.base import (Conversation, Environment, EnvReturn, check_batch, completion_of, error_sample_index,
                             prompt_of, sample_error)
from rlkit.envs.reward_fn import RewardFunctionEnvironment

JudgeFn = Callable[[list[str]], list[str]]  # judge prompts -> the judge's replies, one each
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def last_number_score(reply: str, low: float = 0.0, high: float = 10.0) -> float:
    """The last number in ``reply``, mapped from ``[low, high]`` to ``[0, 1]``; ValueError when there is none or
    it lies outside the range (a judge that wrote "11/10" has not followed the scale)."""
    numbers = _NUMBER.findall(reply)
    if not numbers:
        raise ValueError(f"no score in the judge's reply {reply[:80]!r}")
    value = float(numbers[-1])
    if not low <= value <= high:
        raise ValueError(f"score {value:g} outside [{low:g}, {high:g}] in the judge's reply {reply[:80]!r}")
    return (value - low) / (high - low)


class JudgeEnvironment(Environment):
    """Rewards from a generative judge: ``parse_score(judge([template.format(...) for each sample]))``."""

    def __init__(self, judge: JudgeFn, template: str, parse_score: Callable[[str], float] = last_number_score,
                 name: str = "judge"):
        if not callable(judge):
            raise TypeError(f"JudgeEnvironment needs a batch function list[str] -> list[str], got {type(judge).__name__}")
        self.judge, self.template, self.parse_score, self.name = judge, template, parse_score, name

    def prompt(self, conversation: Conversation, row: dict[str, Any]) -> str:
        """The judge's prompt for one sample (``KeyError`` for a placeholder the row lacks: that sample fails)."""
        return self.template.format_map({**row, "prompt": prompt_of(conversation), "completion": completion_of(conversation)})

    def step(self, conversations: list[Conversation], rows: list[dict[str, Any]]) -> EnvReturn:
        check_batch(conversations, rows)
        b = len(conversations)
        rewards, metadata, errors = [0.0] * b, [{"judge_reply": None} for _ in range(b)], []
        asked: list[tuple[int, str]] = []
        for i, (conversation, row) in enumerate(zip(conversations, rows)):
            try:
                asked.append((i, self.prompt(conversation, row)))
            except Exception as exc:  # noqa: BLE001 - one sample's failure
                errors.append(sample_error(i, exc))
        try:
            replies = list(self.judge([p for _, p in asked])) if asked else []
            if len(replies) != len(asked):
                raise ValueError(f"the judge answered {len(replies)} of {len(asked)} prompts")
        except Exception as exc:  # noqa: BLE001 - the judge call failed: every asked sample failed with it
            errors += [sample_error(i, exc) for i, _ in asked]
            replies, asked = [], []
        for (i, _), reply in zip(asked, replies):
            metadata[i]["judge_reply"] = reply
            try:
                rewards[i] = float(self.parse_score(reply))
            except Exception as exc:  # noqa: BLE001 - an unreadable reply is this sample's failure
                errors.append(sample_error(i, exc))
        errors.sort(key=lambda m: error_sample_index(m) or 0)
        return EnvReturn.single_turn(rewards, metadata, errors)

    def __repr__(self) -> str:
        return f"JudgeEnvironment(name={self.name!r}, template={self.template[:40]!r}...)"


@dataclass(frozen=True)
class RewardComponent:
    """One weighted part of a reward: an environment or a TRL-style function, its weight and its name."""

    source: Union[Environment, Callable[..., list[float]]]
    weight: float = 1.0
    name: Optional[str] = None

    def environment(self) -> Environment:
        return self.source if isinstance(self.source, Environment) else RewardFunctionEnvironment(self.source, self.name)

    @property
    def label(self) -> str:
        return self.name or getattr(self.source, "name", None) or getattr(self.source, "__name__", "reward")


class WeightedRewards(Environment):
    """``sum(weight * reward)`` over components; each component's reward in ``metadata["reward_components"]``."""

    name = "weighted"

    def __init__(self, components: Sequence[Union[RewardComponent, tuple]]):
        parts = [c if isinstance(c, RewardComponent) else RewardComponent(*c) for c in components]
        if not parts:
            raise ValueError("WeightedRewards needs at least one component")
        self.parts = [(p.label, p.environment(), float(p.weight)) for p in parts]
        names = [label for label, _, _ in self.parts]
        if len(set(names)) != len(names):
            raise ValueError(f"component names must be unique (they name the logged metrics), got {names}; "
                             "give RewardComponent(..., name=...)")
        multi = [label for label, env, _ in self.parts if getattr(env, "max_turns", 1) > 1]
        if multi:
            raise ValueError(f"weighted components are single-turn; {multi} play several turns")
        self.name = "+".join(names)

    def step(self, conversations: list[Conversation], rows: list[dict[str, Any]]) -> EnvReturn:
        import torch

        check_batch(conversations, rows)
        b = len(conversations)
        total = torch.zeros(b)
        metadata: list[dict[str, Any]] = [{"reward_components": {}} for _ in range(b)]
        by_sample: dict[int, list[str]] = {}  # one error per failed sample, as the failure fraction counts samples
        for label, env, weight in self.parts:
            result = env.step(conversations, rows)
            total += weight * result.rewards
            for i, (reward, meta) in enumerate(zip(result.rewards.tolist(), result.metadata)):
                metadata[i]["reward_components"][label] = reward
                metadata[i].update({k: v for k, v in meta.items() if k not in metadata[i]})
            for message in result.errors:
                i = error_sample_index(message)
                by_sample.setdefault(-1 if i is None else i, []).append(f"{label}: {message}")
        errors = [messages[0] + (f" (and {len(messages) - 1} more component failure(s))" if len(messages) > 1 else "")
                  for _, messages in sorted(by_sample.items())]
        return EnvReturn(total.float(), torch.ones(b, dtype=torch.bool), [None] * b, metadata, errors)

    def close(self) -> None:
        for _, env, _ in self.parts:
            env.close()

    def __repr__(self) -> str:
        return "WeightedRewards(" + ", ".join(f"{w:g} x {label}" for label, _, w in self.parts) + ")"
