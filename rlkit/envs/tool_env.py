"""A multi-turn environment where the policy may call tools before it answers.

Each ``step`` looks at the last assistant message of every conversation:

- it holds a tool call (``<calc>...</calc>``, see :mod:`rlkit.envs.tools`) and turns are left: the tool runs
  (all of the batch's calls concurrently, each with its timeout) and its result, or a short error, is the
  next message (role ``observation_role``); reward 0, not done;
- it holds a call but this was the last allowed turn (``max_turns`` assistant messages): done, reward 0;
- otherwise it is the final answer: done, reward ``answer_reward(answer, row)`` (default: 1.0 when the
  stripped text equals ``row["answer"]``).

Metadata per sample: ``turn`` (assistant messages so far), ``tool`` (the called tool's name or None),
``tool_ok`` (the call returned text within its limits), ``correct`` (final answers only), ``tool_calls``
(calls in the conversation so far, this one included).

Deliberate simplifications: rewards are outcome rewards (the final answer's); intermediate turns get 0, so a
per-turn signal (e.g. a cost per call) is a subclass overriding :meth:`tool_turn_reward`.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence


from rlkit.envs.base import Conversation, Environment, EnvReturn, check_batch, completion_of, sample_error
from rlkit.envs.tools import Tool, parse_tool_call, run_tools

AnswerReward = Callable[[str, dict[str, Any]], float]


def exact_answer(answer: str, row: dict[str, Any]) -> float:
    """1.0 when ``answer`` stripped equals ``row["answer"]`` stripped, else 0.0."""
    return 1.0 if answer.strip() == str(row["answer"]).strip() else 0.0


def check_tools(tools: Sequence[Any], max_turns: int) -> None:
    """What every tool environment refuses at construction: no assistant turn, or two tools of one name."""
    if max_turns < 1:
        raise ValueError(f"max_turns must be >= 1 (assistant messages per conversation), got {max_turns}")
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise ValueError(f"tool names must be unique, got {names}")


class ToolEnvironment(Environment):
    """Tool calls answered with their results, up to ``max_turns`` assistant messages; see the module docstring."""

    name = "tools"

    def __init__(self, tools: Sequence[Tool], max_turns: int = 3, answer_reward: AnswerReward = exact_answer,
                 observation_role: str = "tool"):
        check_tools(tools, max_turns)
        self.tools = {t.name: t for t in tools}
        self.max_turns, self.answer_reward, self.observation_role = max_turns, answer_reward, observation_role

    def tool_turn_reward(self, name: str, ok: bool) -> float:
        """Reward of a turn that called tool ``name`` (0: only the final answer is rewarded)."""
        return 0.0

    def step(self, conversations: list[Conversation], rows: list[dict[str, Any]]) -> EnvReturn:
        check_batch(conversations, rows)
        b = len(conversations)
        rewards, done = [0.0] * b, [True] * b
        observations: list[Optional[dict[str, str]]] = [None] * b
        metadata: list[dict[str, Any]] = [{} for _ in range(b)]
        errors: list[str] = []
        calls: list[tuple[int, str, str]] = []  # (sample, tool name, input) to run
        for i, (conversation, row) in enumerate(zip(conversations, rows)):
            assistant = [m.get("content", "") for m in conversation if m.get("role") == "assistant"]
            turn, names = len(assistant), list(self.tools)
            metadata[i] = {"turn": turn, "tool": None, "tool_ok": None, "correct": None,
                           "tool_calls": sum(parse_tool_call(text, names) is not None for text in assistant)}
            try:
                text = completion_of(conversation)
                call = parse_tool_call(text, names)
                if call is None:
                    rewards[i] = float(self.answer_reward(text, row))
                    metadata[i]["correct"] = rewards[i] >= 1.0
                elif turn < self.max_turns:
                    calls.append((i, *call))
                else:
                    metadata[i]["tool"] = call[0]  # out of turns: the call is not run
            except Exception as exc:  # noqa: BLE001 - one bad sample must not fail the batch
                errors.append(sample_error(i, exc))
        results = run_tools([(self.tools[name], text) for _, name, text in calls])
        for (i, name, _), (observation, ok) in zip(calls, results):
            done[i] = False
            observations[i] = {"role": self.observation_role, "content": observation}
            metadata[i].update(tool=name, tool_ok=ok)
            rewards[i] = float(self.tool_turn_reward(name, ok))
        import torch

        return EnvReturn(torch.tensor(rewards, dtype=torch.float32), torch.tensor(done), observations, metadata, errors)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(tools={list(self.tools)}, max_turns={self.max_turns})"
