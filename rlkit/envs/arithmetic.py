"""A synthetic arithmetic task: the quickstart's environment, small enough to learn on a CPU.

Prompts are bare expressions (``"123+45"``) and answers their integer value as a string (``"168"``); the
reward is an exact string match after stripping whitespace. The task is generated in process from a seed,
so tests and tutorials need no download and the difficulty is one knob, ``digits``.

Operand distribution (each operand independently): a length ``d`` is drawn uniformly from
``1..digits``, then the value uniformly among the ``d``-digit numbers: ``0..9`` for ``d = 1`` and
``10**(d-1) .. 10**d - 1`` otherwise, so there are never leading zeros. Drawing the length first keeps short
operands as common as long ones (uniform values would make nearly every operand ``digits`` long). The
operation is drawn uniformly from ``operations``. ``"-"`` can give negative answers (``"3-7"`` -> ``"-4"``).

The answer is the whole completion, stripped (``answer_from="completion"``), or with ``answer_from="last_number"``
(``env.answer_from``) the last number it writes (:mod:`rlkit.envs.answers`): what a chat model asked "What is 27+82?"
answers, ``"27 + 82 = 109"``.

Deliberate simplifications: no chain-of-thought format; exact text match of the answer, so ``"0168"`` (and with
``completion``, ``"168."``) score 0, and ``"168.0"`` scores 0 under either rule.
"""

from __future__ import annotations

import itertools
import random
from typing import Any, Iterator, Literal, Sequence, get_args

from rlkit.envs.answers import AnswerFrom, answer_of, check_answer_from
from rlkit.envs.base import Conversation, Environment, EnvReturn, check_batch, completion_of, sample_error

Operation = Literal["+", "-", "*"]
OPERATIONS: tuple[str, ...] = get_args(Operation)


def _check_args(digits: int, operations: Sequence[str]) -> tuple[str, ...]:
    if not isinstance(digits, int) or isinstance(digits, bool) or digits < 1:
        raise ValueError(f"digits must be an integer >= 1 (the longest operand), got {digits!r}")
    ops = tuple(operations)
    bad = [op for op in ops if op not in OPERATIONS]
    if not ops or bad:
        raise ValueError(f"operations must be a non-empty subset of {OPERATIONS}, got {ops!r}")
    return ops


def _operand(rng: random.Random, digits: int) -> int:
    d = rng.randint(1, digits)
    return rng.randint(0, 9) if d == 1 else rng.randint(10 ** (d - 1), 10**d - 1)


def iter_arithmetic_rows(digits: int, seed: int, operations: Sequence[str] = ("+",)) -> Iterator[dict[str, str]]:
    """An endless, seeded stream of ``{"prompt": "a<op>b", "answer": str(value)}`` rows."""
    ops = _check_args(digits, operations)
    rng = random.Random(seed)
    while True:
        a, b = _operand(rng, digits), _operand(rng, digits)
        op = ops[rng.randrange(len(ops))]
        value = a + b if op == "+" else a - b if op == "-" else a * b
        yield {"prompt": f"{a}{op}{b}", "answer": str(value)}


def make_arithmetic_rows(n: int, digits: int, seed: int, operations: Sequence[str] = ("+",)) -> list[dict[str, str]]:
    """The first ``n`` rows of ``iter_arithmetic_rows(digits, seed, operations)`` (duplicates possible)."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return list(itertools.islice(iter_arithmetic_rows(digits, seed, operations), n))


def count_arithmetic_prompts(digits: int, operations: Sequence[str] = ("+",)) -> int:
    """How many distinct prompts the generator can produce: ``len(ops) * (10**digits)**2``."""
    ops = _check_args(digits, operations)
    return len(set(ops)) * (10**digits) ** 2


class ArithmeticEnvironment(Environment):
    """Reward 1.0 when the answer equals ``row["answer"]`` (both as text, stripped), else 0.0. The answer: the
    completion stripped, or with ``answer_from="last_number"`` the last number in it (none: reward 0).

    Metadata per sample: ``parsed`` (the answer read, None without a number) and ``correct`` (bool).
    """

    name = "arithmetic"

    def __init__(self, answer_from: AnswerFrom = "completion"):
        self.answer_from = check_answer_from(answer_from)

    def step(self, conversations: list[Conversation], rows: list[dict[str, Any]]) -> EnvReturn:
        check_batch(conversations, rows)
        rewards, metadata, errors = [], [], []
        for i, (conversation, row) in enumerate(zip(conversations, rows)):
            try:
                parsed = answer_of(completion_of(conversation), self.answer_from)
                correct = parsed is not None and parsed == str(row["answer"]).strip()
            except Exception as exc:  # noqa: BLE001 - one bad sample must not fail the batch
                errors.append(sample_error(i, exc))
                parsed, correct = None, False
            rewards.append(1.0 if correct else 0.0)
            metadata.append({"parsed": parsed, "correct": correct})
        return EnvReturn.single_turn(rewards, metadata, errors)

    def __repr__(self) -> str:
        return f"ArithmeticEnvironment(name={self.name!r}, answer_from={self.answer_from!r})"
