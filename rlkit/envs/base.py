"""The environment interface: one batched, multi-turn-capable ``step``.

An environment sees the conversation so far (OpenAI-style messages whose last one is the assistant's
completion) and the dataset row behind each sample (which holds the ground truth), and answers with a
reward, whether the episode is over, and, for unfinished samples, the next message to append. Single-turn
tasks return ``done=True`` everywhere and no observations; multi-turn ones (the tool environments) answer an
unfinished sample with its next message, and the multi-turn rollout needs no stage code of their own.

Failures are contained per sample: a sample whose scoring raises gets reward 0 and one message in
``errors`` (naming its index and the exception), so one malformed completion never kills a training step.
Programming errors that cannot be pinned on one sample (mismatched batch sizes, a reward function returning
the wrong number of values) raise.

Deliberate simplifications: ``step`` is synchronous; environments hold no per-episode state between calls
(the conversation carries it), so ``reset`` is not needed.
"""

from __future__ import annotations

import math
import numbers
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence

from rlkit.notebook.html import CodeRepr

if TYPE_CHECKING:  # torch is imported where a return is built or checked: the config reads this module, no tensors
    from torch import Tensor

Message = dict[str, str]  # {"role": "user" | "assistant" | "system" | "tool", "content": ...}
Conversation = list[Message]

# Above this share of failed samples in one scored batch the reward itself is broken (a typo, a missing
# column), not the samples: ``score`` raises rather than train on zeros. The config's
# ``env.max_reward_failure_fraction`` defaults to it.
MAX_REWARD_FAILURE_FRACTION = 0.5


@dataclass(frozen=True)
class EnvReturn(CodeRepr):
    """What one ``step`` over a batch of ``B`` conversations returns."""

    rewards: Tensor  # [B] float32, finite; 0.0 for samples whose scoring failed
    done: Tensor  # [B] bool, True when the episode of sample i is over
    # [B] next message for unfinished samples (or a list of messages: one tool message per call), None where done
    observations: list[Optional[Message | list[Message]]]
    metadata: list[dict[str, Any]]  # [B] small per-sample facts (parsed answer, correct flag, ...)
    errors: list[str]  # one message per failed sample: "sample <i>: <Exception>: <text>"

    def __post_init__(self) -> None:
        # Checked here once so that no stage has to re-check an environment's output.
        import torch

        b = self.rewards.shape[0] if self.rewards.dim() == 1 else -1
        if self.rewards.dim() != 1 or self.rewards.dtype != torch.float32:
            raise ValueError(f"EnvReturn.rewards must be a [B] float32 tensor, got {self.rewards.dtype} "
                             f"{tuple(self.rewards.shape)}")
        if self.done.shape != (b,) or self.done.dtype != torch.bool:
            raise ValueError(f"EnvReturn.done must be a [{b}] bool tensor, got {self.done.dtype} "
                             f"{tuple(self.done.shape)}")
        if len(self.observations) != b or len(self.metadata) != b:
            raise ValueError(f"EnvReturn needs {b} observations and metadata entries, got "
                             f"{len(self.observations)} and {len(self.metadata)}")
        for i, (obs, finished) in enumerate(zip(self.observations, self.done.tolist())):
            if finished != (obs is None):
                raise ValueError(f"sample {i}: an observation is given exactly for unfinished samples "
                                 f"(done={finished}, observation={obs!r})")
        if not torch.isfinite(self.rewards).all():
            raise ValueError("EnvReturn.rewards must be finite; map failed samples to 0 and report them in errors")

    @classmethod
    def single_turn(cls, rewards: Sequence[float], metadata: list[dict[str, Any]], errors: list[str]) -> "EnvReturn":
        """Every episode ends after one reply: ``done`` all True, no observations."""
        import torch

        b = len(rewards)
        return cls(
            rewards=torch.tensor(list(rewards), dtype=torch.float32).reshape(b),
            done=torch.ones(b, dtype=torch.bool),
            observations=[None] * b,
            metadata=metadata,
            errors=errors,
        )

    @property
    def num_errors(self) -> int:
        return len(self.errors)

    def __len__(self) -> int:
        return self.rewards.shape[0]

    def __repr__(self) -> str:
        b = len(self)
        mean = self.rewards.mean().item() if b else float("nan")
        return (f"EnvReturn(B={b}, mean_reward={mean:.3f}, done={int(self.done.sum())}/{b}, "
                f"errors={self.num_errors})")


class Environment(ABC):
    """Scores a batch of conversations. One implementation per task; stages only call ``step``."""

    name: str = "environment"
    max_turns: int = 1  # assistant turns per conversation; > 1: the rollout plays conversations (stages.conversations)

    @abstractmethod
    def step(self, conversations: list[Conversation], rows: list[dict[str, Any]]) -> EnvReturn:
        """Score ``conversations[i]`` (its last message is the assistant's completion) against ``rows[i]``."""

    def close(self) -> None:
        """Release workers or files the environment holds; a no-op for in-process environments."""

    def __enter__(self) -> "Environment":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"

    def _repr_html_(self) -> str:
        return f"<code>{type(self).__name__}</code> environment <b>{self.name}</b>"


def check_batch(conversations: list[Conversation], rows: list[dict[str, Any]]) -> None:
    """Raise on a batch that is wrong as a whole (a caller's bug, not a sample's)."""
    if len(conversations) != len(rows):
        raise ValueError(f"step got {len(conversations)} conversations but {len(rows)} rows; "
                         "pass one dataset row per sample (repeat a prompt's row for each of its G samples)")


def completion_of(conversation: Conversation) -> str:
    """The assistant's completion: the content of the conversation's last message."""
    if not conversation or conversation[-1].get("role") != "assistant":
        last = conversation[-1].get("role") if conversation else None
        raise ValueError(f"the last message must be the assistant's completion, got role {last!r}")
    return conversation[-1]["content"]


def prompt_of(conversation: Conversation) -> str:
    """The text the completion answers: the last non-assistant message before it ("" if none)."""
    for message in reversed(conversation[:-1]):
        if message.get("role") != "assistant":
            return message["content"]
    return ""


def as_reward(value: Any) -> float:
    """``value`` as a finite float, or a ``ValueError``/``TypeError`` saying why it is not one.

    Strings are rejected even when they look numeric: a reward function returning ``"1"`` is almost
    certainly returning the model's text by mistake.
    """
    import torch

    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if not isinstance(value, numbers.Real):
        raise TypeError(f"reward is not a number: {value!r} ({type(value).__name__})")
    reward = float(value)
    if not math.isfinite(reward):
        raise ValueError(f"reward is not finite: {reward}")
    return reward


def sample_error(index: int, exc: BaseException) -> str:
    """The one-line message for a failed sample, in the format ``EnvReturn.errors`` documents."""
    return f"sample {index}: {type(exc).__name__}: {exc}"


def error_sample_index(message: str) -> Optional[int]:
    """The ``<i>`` of an ``EnvReturn.errors`` message (``[name: ]sample <i>: ...``), None if it has none."""
    match = re.search(r"\bsample (\d+): ", message)
    return int(match.group(1)) if match else None
