"""A multi-turn environment whose tools are called in the model's own JSON format (:mod:`rlkit.envs.tool_calls`).

Each ``step`` reads the last assistant message of every conversation:

- it holds tool calls (any number, in ``call_format``) and turns are left: every call runs (the batch's calls
  concurrently, each within its timeout) and the next messages are one ``tool`` message per call, in order; a
  malformed call, an unknown tool or arguments that fail the schema are answered with an ``error: ...`` message;
  reward 0, not done;
- it holds calls but this was the last allowed turn: done, reward 0;
- otherwise it is the final answer: done, reward ``answer_reward(answer, row)`` (default: exact match with
  ``row["answer"]``).

The tools reach the prompt through the chat template: :attr:`NativeToolEnvironment.tool_schemas` is what the
multi-turn rollout passes as ``apply_chat_template(..., tools=)``, and the tool messages are rendered by the
template too (Qwen's joins consecutive ``tool`` messages into one user turn of ``<tool_response>`` blocks), then
appended as ids (:mod:`rlkit.stages.conversations`).

Metadata per sample: ``turn``, ``tool_calls`` (well-formed calls in this message), ``tool_errors`` (error
observations), ``correct`` (final answers only).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence


from rlkit.envs.base import Conversation, Environment, EnvReturn, check_batch, completion_of, sample_error
from rlkit.envs.tool_calls import JsonTool, ParsedCalls, ToolCallFormat, parse_tool_calls, tool_messages
from rlkit.envs.tool_env import AnswerReward, check_tools, exact_answer


class NativeToolEnvironment(Environment):
    """JSON tools called in ``call_format`` (``hermes`` or ``llama3``), answered with ``tool`` messages."""

    name = "native_tools"

    def __init__(self, tools: Sequence[JsonTool], max_turns: int = 3, answer_reward: AnswerReward = exact_answer,
                 call_format: ToolCallFormat = "hermes"):
        check_tools(tools, max_turns)
        parse_tool_calls("", call_format)  # an unknown format is refused now
        self.tools, self.max_turns, self.answer_reward, self.call_format = list(tools), max_turns, answer_reward, call_format

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools as the chat template takes them (``tools=``)."""
        return [t.schema() for t in self.tools]

    def step(self, conversations: list[Conversation], rows: list[dict[str, Any]]) -> EnvReturn:
        check_batch(conversations, rows)
        b = len(conversations)
        rewards, done = [0.0] * b, [True] * b
        observations: list[Optional[list[dict[str, str]]]] = [None] * b
        metadata: list[dict[str, Any]] = [{} for _ in range(b)]
        errors: list[str] = []
        to_run: list[tuple[int, ParsedCalls]] = []
        for i, (conversation, row) in enumerate(zip(conversations, rows)):
            turn = sum(m.get("role") == "assistant" for m in conversation)
            metadata[i] = {"turn": turn, "tool_calls": 0, "tool_errors": 0, "correct": None}
            try:
                text = completion_of(conversation)
                parsed = parse_tool_calls(text, self.call_format)
                metadata[i].update(tool_calls=len(parsed.calls), tool_errors=len(parsed.errors))
                if not parsed:
                    rewards[i] = float(self.answer_reward(text, row))
                    metadata[i]["correct"] = rewards[i] >= 1.0
                elif turn < self.max_turns:
                    to_run.append((i, parsed))
            except Exception as exc:  # noqa: BLE001 - one bad sample must not fail the batch
                errors.append(sample_error(i, exc))
        answers = tool_messages([parsed for _, parsed in to_run], self.tools)
        for (i, _), messages in zip(to_run, answers):
            done[i], observations[i] = False, messages
            metadata[i]["tool_errors"] = sum(m["content"].startswith("error:") for m in messages)
        import torch

        return EnvReturn(torch.tensor(rewards, dtype=torch.float32), torch.tensor(done), observations, metadata, errors)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(tools={[t.name for t in self.tools]}, max_turns={self.max_turns}, "
                f"call_format={self.call_format!r})")
