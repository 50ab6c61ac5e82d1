"""Which part of a completion is its answer: ``env.answer_from``, one rule shared by the environments that offer it.

Why: a chat model asked "What is 27+82? Answer with just the number." still writes "27 + 82 = 109"; an
exact-match reward on the whole completion scores that 0 although the number it ends on is right. With
``env.answer_from: last_number`` the answer is the last number the completion writes, and the environment scores
that as it would score a bare answer. ``completion`` (the default) is each environment's own rule.

A number: an optional sign (``-`` or ``+``, counted only where it does not follow a digit, a letter or a closing
bracket, so ``27-82`` is the numbers 27 and 82, and ``= -55`` is -55), digits, optionally grouped by commas in
threes (``1,200``: the commas are dropped, ``1200``), optionally a decimal part (``3.5``). A period with no digit
after it is not part of the number (``-46.`` -> ``-46``); a leading ``+`` is dropped (``+5`` -> ``5``).

Deliberate simplifications: no normalisation beyond that (``109.0`` stays ``109.0``, so it does not equal the
answer ``109``), no exponents (``1e5`` is 1 and 5), no spelled-out numbers, and ASCII digits and signs only.
"""

from __future__ import annotations

import re
from typing import Literal, Optional, get_args

AnswerFrom = Literal["completion", "last_number"]
ANSWER_FROM: tuple[str, ...] = get_args(AnswerFrom)
# the environments (by registry name) that read env.answer_from; a test keeps it in step with their constructors
ANSWER_FROM_ENVS = ("arithmetic", "reasoning_gym")

_NUMBER = re.compile(r"(?:(?<![\w)\]])[-+])?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?")


def last_number(text: str) -> Optional[str]:
    """The last number written in ``text`` as plain text (commas and a leading ``+`` dropped), None when it has
    none: ``"27 + 82 = 109"`` -> ``"109"``, ``"The answer is -46."`` -> ``"-46"``, ``"1,200"`` -> ``"1200"``."""
    numbers = _NUMBER.findall(text)
    return numbers[-1].replace(",", "").removeprefix("+") if numbers else None


def check_answer_from(answer_from: str) -> str:
    """``answer_from`` if it is one of :data:`ANSWER_FROM`, else a ValueError naming them."""
    if answer_from not in ANSWER_FROM:
        raise ValueError(f"answer_from must be one of {ANSWER_FROM}, got {answer_from!r}")
    return answer_from


def answer_of(completion: str, answer_from: str) -> Optional[str]:
    """The answer ``answer_from`` reads from ``completion`` for the environments whose own rule is the stripped
    completion: that, or its :func:`last_number` (None without one)."""
    return last_number(completion) if answer_from == "last_number" else completion.strip()
