"""Arithmetic with a calculator: the multi-turn task of the ``multiturn_quickstart`` preset.

Prompts are the arithmetic task's (``"4821+937"``, :mod:`rlkit.envs.arithmetic`) with operands too long for a
tiny model to add reliably in its head. The policy may call the calculator, ``<calc>4821+937</calc>``; the
environment answers with the result as the next message; the policy's next turn is its final answer, rewarded
1.0 when it equals the sum exactly. Two assistant turns at most.

The SFT warm start (``sft.response_key: demonstration``) trains on demonstrations, whole transcripts written
with the chat template's tokens: ``TOOL_DEMONSTRATION_FRACTION`` of them call the calculator and copy its
result, the others answer directly. The warm-started policy so knows both the format and the arithmetic it
can half do, and calls the tool on only some prompts; what RL has to learn is *when to use the tool*, which
the outcome reward alone teaches. (An SFT loss on a demonstration also covers the calculator's message: a
warm start, not the RL objective; the multi-turn rollout never trains on environment tokens.)

``tool_arithmetic_native`` is the same task with a native JSON tool (:mod:`rlkit.envs.native_tools`): the tool
``add(a, b)`` declared as a JSON schema and rendered by the chat template (``tools=``), called the Hermes way,
``<tool_call>\n{"name": "add", "arguments": {"a": 4821, "b": 937}}\n</tool_call>``, answered with a ``tool``
message; its demonstrations are written in the test BPE tokenizer's ChatML/Hermes template
(:data:`rlkit.models.bpe.CHAT_TEMPLATE`; a test checks them against ``apply_chat_template``).

Deliberate simplifications: the environment's message uses the ``user`` role, which the character
tokenizer's template renders as one special token (``tool`` would be eight characters of a 64-token budget).
"""

from __future__ import annotations

import json
import random
from typing import Any, Callable, Iterator, Sequence

from rlkit.envs.arithmetic import iter_arithmetic_rows
from rlkit.envs.native_tools import NativeToolEnvironment
from rlkit.envs.tool_calls import JsonTool
from rlkit.envs.tool_env import ToolEnvironment
from rlkit.envs.tools import Calculator

TOOL_DEMONSTRATION_FRACTION = 0.3  # of the SFT demonstrations that call the calculator
OBSERVATION_ROLE = "user"
# what the character tokenizer's chat template writes between turns (rlkit.models.tokenizer.CHAT_TEMPLATE)
_TURN_END, _MESSAGE_START, _ASSISTANT = "<|end|>", f"<|{OBSERVATION_ROLE}|>", "<|assistant|>"


def tool_demonstration(prompt: str, answer: str) -> str:
    """The transcript after the prompt of a conversation that calls the calculator, as SFT text
    (the response's final EOS is added by the SFT batch)."""
    return f"<calc>{prompt}</calc>{_TURN_END}{_MESSAGE_START}{answer}{_TURN_END}{_ASSISTANT}{answer}"


def native_tool_demonstration(prompt: str, answer: str) -> str:
    """:func:`tool_demonstration` with the native ``add`` tool, in the BPE tokenizer's ChatML/Hermes template."""
    a, b = prompt.split("+")
    call = json.dumps({"name": "add", "arguments": {"a": int(a), "b": int(b)}})
    return (f"<tool_call>\n{call}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{answer}\n"
            f"</tool_response><|im_end|>\n<|im_start|>assistant\n{answer}")


def iter_tool_arithmetic_rows(digits: int, seed: int, operations: Sequence[str] = ("+",),
                              tool_fraction: float = TOOL_DEMONSTRATION_FRACTION,
                              demonstration: Callable[[str, str], str] = tool_demonstration) -> Iterator[dict[str, str]]:
    """The arithmetic rows of ``(digits, seed)`` with a ``demonstration`` column: a calculator transcript for
    ``tool_fraction`` of the rows (chosen by ``seed``), the bare answer for the others."""
    choice = random.Random(seed + 1)
    for row in iter_arithmetic_rows(digits, seed, operations):
        uses_tool = choice.random() < tool_fraction
        yield dict(row, demonstration=demonstration(row["prompt"], row["answer"]) if uses_tool else row["answer"])


def iter_native_tool_arithmetic_rows(digits: int, seed: int) -> Iterator[dict[str, str]]:
    """:func:`iter_tool_arithmetic_rows` with native ``add`` demonstrations (the ``tool_arithmetic_native`` task)."""
    return iter_tool_arithmetic_rows(digits, seed, demonstration=native_tool_demonstration)


def add_tool() -> JsonTool:
    """``add(a, b)``: the sum of two integers, as text."""
    integer = {"type": "integer"}
    return JsonTool("add", lambda a, b: str(a + b),
                    {"type": "object", "properties": {"a": integer, "b": integer}, "required": ["a", "b"]})


class ToolArithmeticEnvironment(ToolEnvironment):
    """The calculator task: one optional ``<calc>`` call, then the answer (exact match with ``row["answer"]``)."""

    name = "tool_arithmetic"

    def __init__(self, max_turns: int = 2):
        super().__init__([Calculator()], max_turns=max_turns, observation_role=OBSERVATION_ROLE)


class NativeToolArithmeticEnvironment(NativeToolEnvironment):
    """The calculator task with the native JSON tool ``add(a, b)`` called in ``call_format`` (Hermes by default)."""

    name = "tool_arithmetic_native"

    def __init__(self, max_turns: int = 2, call_format: str = "hermes"):
        super().__init__([add_tool()], max_turns=max_turns, call_format=call_format)

    @classmethod
    def default_tool_schemas(cls) -> list[dict[str, Any]]:
        """The tools as the chat template takes them, without building the environment (for SFT's prompts)."""
        return [add_tool().schema()]
