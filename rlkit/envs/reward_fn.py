"""Turn a plain reward function into a single-turn environment.

The function has TRL's signature, ``f(prompts, completions, **columns) -> list[float]``, where
``columns`` are the dataset row fields as lists (every field except ``prompt`` and ``completion``, which
TRL also leaves out), so reward functions written for TRL work unchanged.

Why the robustness: a user's reward function sees whatever the policy writes, and a single odd completion
(an unparsable number, an empty string) should cost that sample its reward, not the training step. So:

- the function is first called on the whole batch; if it raises, the batch is halved and each half called,
  a half that raises is halved again, down to single samples: only the samples that fail alone get reward 0
  and an error message. Why halves, not one call per sample: a reward with a fixed cost per call (a model,
  a remote judge, a sandbox) would pay it ``B + 1`` times when one sample breaks the batch; halving costs at
  most ``1 + 2 k log2(B)`` calls for ``k`` failing samples, and a failure that does not come back 3 calls;
- a value that is NaN, infinite or not a number gives that sample reward 0 and an error message;
- a list of the wrong length, or a dict (whose length and iteration are its keys, not rewards), is a bug in
  the function, not in a sample, and raises ``RewardError``.

Deliberate simplifications: the prompt handed to the function is the text of the last user message (the
raw prompt, not the chat-templated one); functions run in the calling process with no timeout (wrap slow
checks yourself, as ``MathEnvironment`` does).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Set as AbstractSet
from typing import Any, Callable, Optional

from rlkit.envs.base import (
    Conversation,
    Environment,
    EnvReturn,
    as_reward,
    check_batch,
    completion_of,
    prompt_of,
    sample_error,
)
from rlkit.errors import RewardError

RewardFn = Callable[..., list[float]]  # f(prompts: list[str], completions: list[str], **columns) -> list[float]

_NOT_COLUMNS = ("prompt", "completion")


class RewardFunctionEnvironment(Environment):
    """A single-turn environment whose reward is ``fn(prompts, completions, **columns)``."""

    def __init__(self, fn: RewardFn, name: Optional[str] = None):
        if not callable(fn):
            raise TypeError(f"RewardFunctionEnvironment needs a callable, got {type(fn).__name__}")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", type(fn).__name__)

    def step(self, conversations: list[Conversation], rows: list[dict[str, Any]]) -> EnvReturn:
        check_batch(conversations, rows)
        prompts = [prompt_of(c) for c in conversations]
        completions = [completion_of(c) for c in conversations]
        columns = _columns(rows)
        batch_size = len(completions)
        if batch_size == 0:
            return EnvReturn.single_turn([], [], [])
        self._check_signature(prompts, completions, columns)

        try:
            raw = self._call(prompts, completions, columns, expected=batch_size)
            isolated = False
        except RewardError:
            raise
        except Exception:  # noqa: BLE001 - which samples broke the batch call? Halve until they are found
            raw = self._bisect(list(range(batch_size)), prompts, completions, columns)
            isolated = True

        rewards, errors, metadata = [], [], []
        for i, value in enumerate(raw):
            try:
                if isinstance(value, Exception):
                    raise value
                rewards.append(as_reward(value))
            except Exception as exc:  # noqa: BLE001
                rewards.append(0.0)
                errors.append(f"{self.name}: {sample_error(i, exc)}")
            metadata.append({"isolated": isolated})
        return EnvReturn.single_turn(rewards, metadata, errors)

    def _bisect(self, indices: list[int], prompts: list[str], completions: list[str],
                columns: dict[str, list[Any]]) -> list[Any]:
        """Rewards (or the exception of a sample that fails alone) for ``indices``, whose call as one batch
        raised: each half is called, and a half that raises is halved again (see the module docstring)."""
        out = []
        for half in (indices[: len(indices) // 2], indices[len(indices) // 2:]) if len(indices) > 1 else (indices,):
            try:
                out += self._call([prompts[i] for i in half], [completions[i] for i in half],
                                  {k: [v[i] for i in half] for k, v in columns.items()}, expected=len(half))
            except RewardError:
                raise
            except Exception as exc:  # noqa: BLE001 - a sample that fails alone is contained to itself by design
                out += [exc] if len(half) == 1 else self._bisect(half, prompts, completions, columns)
        return out

    def _check_signature(self, prompts: list[str], completions: list[str], columns: dict[str, list[Any]]) -> None:
        """RewardError when ``fn`` cannot take ``(prompts, completions, **columns)`` at all: every sample would
        fail with the same TypeError, which is the function's signature, not the samples."""
        try:
            signature = inspect.signature(self.fn)
        except (TypeError, ValueError):  # a builtin or C callable: its call will tell
            return
        try:
            signature.bind(prompts, completions, **columns)
        except TypeError as exc:
            raise RewardError(
                f"reward function {self.name}{signature} cannot be called as f(prompts, completions, **columns) "
                f"with this batch's columns {sorted(columns)}: {exc}. Fix: give it TRL's signature, e.g. "
                f"def {self.name}(prompts, completions, **columns) (two lists of strings, then each dataset "
                "column by name as a list; **columns takes the ones it does not use)") from None

    def _call(self, prompts: list[str], completions: list[str], columns: dict[str, list[Any]], expected: int) -> list:
        out = self.fn(prompts, completions, **columns)
        if isinstance(out, (Mapping, AbstractSet)):
            keys = list(out)[:4]
            kind = "keys" if isinstance(out, Mapping) else "items"
            raise RewardError(f"reward function {self.name!r} returned a {type(out).__name__} ({kind} {keys}"
                              f"{'...' if len(out) > 4 else ''}), expected a list of {expected} floats in the order "
                              "of the completions; a dict's length and iteration are its keys, which would be read as "
                              "rewards. Fix: return a list, e.g. [scores[c] for c in completions]")
        try:
            if isinstance(out, (str, bytes)):
                raise TypeError
            received = len(out)
        except TypeError:
            raise RewardError(f"reward function {self.name!r} returned {type(out).__name__}, expected a list of "
                              f"{expected} floats (one per completion)") from None
        if received != expected:
            raise RewardError(f"reward function {self.name!r} returned {received} rewards for {expected} completions; "
                              "it must return exactly one reward per completion")
        return list(out)

    def __repr__(self) -> str:
        return f"RewardFunctionEnvironment(fn={self.name!r})"


def _columns(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Row fields as lists, TRL-style; a field missing from some rows is None there."""
    keys = dict.fromkeys(k for row in rows for k in row if k not in _NOT_COLUMNS)  # every row's, in order seen
    return {k: [row.get(k) for row in rows] for k in keys}
