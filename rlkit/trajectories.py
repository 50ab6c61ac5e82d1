"""The one batch type that flows through the stages.

Padding convention (stated once, used everywhere): every tensor of shape ``[B, T]`` holds the prompt
followed by the completion, **right-padded** to a common length ``T``. ``B = N * G``: the ``G`` samples of
one prompt are contiguous rows, so ``tensor.view(N, G, ...)`` groups them.

Per-token values are aligned with the token they score: ``generator_logprobs[i, t]`` is
``log p(input_ids[i, t] | input_ids[i, :t])``. Positions outside the completion (prompt and padding) hold 0
and are excluded by ``loss_mask``.

Each stage returns a new instance (``dataclasses.replace``); nothing mutates a batch in place, so a notebook
cell can be re-run safely.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import Tensor

from rlkit.errors import StageOrderError
from rlkit.notebook.conversation import conversation_view
from rlkit.notebook.display import token_view, trajectories_html, trajectories_summary


@dataclass(frozen=True)
class Trajectories:
    """A batch of ``B = N * G`` sampled completions (``G`` per prompt), filled in stage by stage."""

    prompts: tuple[str, ...]  # [B] rendered prompt text (chat template applied)
    completions: tuple[str, ...]  # [B] generated text, stop string excluded
    input_ids: Tensor  # [B, T] int64 prompt + completion tokens, right-padded with pad_token_id
    attention_mask: Tensor  # [B, T] bool, True on real (prompt or completion) tokens
    loss_mask: Tensor  # [B, T] bool, True on completion tokens (the ones the loss sees)
    generator_logprobs: Tensor  # [B, T] float32, generator's logprob of each completion token, 0 elsewhere
    finish_reasons: tuple[str, ...]  # [B] "stop" (EOS or stop string) or "length" (hit max_new_tokens)
    group_size: int  # G
    policy_version: int  # optimizer steps the generating weights had taken
    rows: tuple[dict[str, Any], ...] = ()  # [N] the dataset rows the prompts came from (answers, ...)

    # Filled in by later stages.
    rewards: Optional[Tensor] = None  # [B] float32, from score() (multi-turn: the sum of turn_rewards)
    # [B, T] float32, multi-turn only: each environment reward on the last generated token of the turn it answers
    turn_rewards: Optional[Tensor] = None
    reward_errors: tuple[str, ...] = ()  # messages of samples whose reward function failed (reward 0)
    env_metadata: tuple[dict[str, Any], ...] = ()  # [B] what the environment said about each sample
    advantages: Optional[Tensor] = None  # [B, T] float32, 0 outside loss_mask, from advantages()
    prev_logprobs: Optional[Tensor] = None  # [B, T] float32, trainer logprobs before the update, from logprobs()
    ref_logprobs: Optional[Tensor] = None  # [B, T] float32, frozen reference policy, from logprobs()
    entropy: Optional[Tensor] = None  # [B, T] float32, trainer's per-token entropy, from logprobs()
    values: Optional[Tensor] = None  # [B, T] float32, the critic's value of the state before each completion token
    teacher_logprobs: Optional[Tensor] = None  # [B, T] float32, the distillation teacher's, from teacher_logprobs()
    info: dict[str, Any] = field(default_factory=dict)  # small per-batch facts (timings, counts)
    rollout_step: Optional[int] = None  # steps completed when Session.rollout() made it; None: made elsewhere
    # the tokenizer that made input_ids: the token views decode with it (not pickled: Ray workers never decode)
    tokenizer: Any = field(default=None, repr=False, compare=False)

    # ---- shape facts -------------------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        """B: samples in the batch (prompts x group size)."""
        return self.input_ids.shape[0]

    @property
    def num_prompts(self) -> int:
        """Prompts in the batch (B / group size)."""
        return self.batch_size // self.group_size

    @property
    def completion_lengths(self) -> Tensor:  # [B] int64
        """Completion tokens per sample (the loss mask's count)."""
        return self.loss_mask.sum(dim=1)

    @property
    def prompt_lengths(self) -> Tensor:  # [B] int64
        """Prompt tokens per sample (attended, not in the loss)."""
        return (self.attention_mask & ~self.loss_mask).sum(dim=1)

    @property
    def truncated(self) -> Tensor:  # [B] bool
        """Samples cut at ``max_new_tokens`` (finish reason ``length``)."""
        return torch.tensor([r == "length" for r in self.finish_reasons])

    @property
    def row_of_sample(self) -> tuple[dict[str, Any], ...]:  # [B] the dataset row behind each sample
        """The dataset row (prompt, answer...) of each sample; empty when the batch carries no rows."""
        return tuple(self.rows[i // self.group_size] for i in range(self.batch_size)) if self.rows else ()

    # ---- guards and slicing ------------------------------------------------------------------------
    def require(self, field_name: str, stage: str) -> Tensor:
        """Return ``field_name`` or raise a guard error that names the stage that fills it."""
        value = getattr(self, field_name)
        if value is None:
            raise StageOrderError(f"this batch has no {field_name} yet: run {stage} on it first")
        return value

    def with_(self, **changes: Any) -> "Trajectories":
        """A copy with ``changes`` applied (``dataclasses.replace``); the original is untouched."""
        return dataclasses.replace(self, **changes)

    def select(self, index: slice | Tensor) -> "Trajectories":
        """Rows ``index`` of every per-sample field (for microbatching). Group structure is not kept."""
        idx = list(range(self.batch_size))[index] if isinstance(index, slice) else index.tolist()
        tensors = {f.name: getattr(self, f.name)[idx] for f in dataclasses.fields(self)
                   if isinstance(getattr(self, f.name), Tensor)}
        pick = lambda seq: tuple(seq[i] for i in idx) if seq else seq  # noqa: E731
        per_sample = {n: pick(getattr(self, n)) for n in ("prompts", "completions", "finish_reasons", "env_metadata")}
        return dataclasses.replace(self, rows=(), group_size=1, **per_sample, **tensors)

    def select_groups(self, groups: Tensor) -> "Trajectories":
        """The prompt groups at indices ``groups`` [K] (all G samples each), group structure kept."""
        rows = (groups.view(-1, 1) * self.group_size + torch.arange(self.group_size)).flatten()
        picked = self.select(rows)
        return dataclasses.replace(picked, group_size=self.group_size,
                                   rows=tuple(self.rows[i] for i in groups.tolist()) if self.rows else ())

    @staticmethod
    def concat(batches: "list[Trajectories]") -> "Trajectories":
        """Batches of the same group size stacked along B, right-padded to the longest T."""
        first = batches[0]
        width = max(b.input_ids.shape[1] for b in batches)

        def cat(name: str):
            values = [getattr(b, name) for b in batches]
            if any(v is None for v in values):
                return None
            return torch.cat([v if v.dim() == 1 else torch.nn.functional.pad(v, (0, width - v.shape[1]))
                              for v in values])

        tensors = {f.name: cat(f.name) for f in dataclasses.fields(first) if isinstance(getattr(first, f.name), Tensor)}
        joined = {name: tuple(x for b in batches for x in getattr(b, name))
                  for name in ("prompts", "completions", "finish_reasons", "rows", "env_metadata", "reward_errors")}
        return dataclasses.replace(first, **joined, **tensors)

    def __len__(self) -> int:
        return self.batch_size

    # ---- notebook display (formatting only; see rlkit.notebook.display) ------------------------------------
    def show(self, color: Any = "advantages", tokenizer: Any = None, rows: Any = 8, label: Optional[str] = None) -> Any:
        """Completion tokens of the samples ``rows`` names (the first N for an int, a slice such as ``slice(8, 16)``,
        or a list of sample indices such as ``[3, 17]``) coloured by ``color``: "advantages", "mismatch"
        (|generator - trainer logprob|), "teacher" (student - teacher logprob: red where the distillation teacher
        finds the token less likely), "entropy" or any [B, T] tensor (named ``label``). ``tokenizer`` decodes
        the ids (default: the tokenizer the batch was made with; a batch built by hand must be given one)."""
        return token_view(self, color, tokenizer, rows, label)

    def show_conversation(self, index: int = 0, tokenizer: Any = None) -> Any:
        """Every token of sample ``index`` (prompt, turns, environment messages), the trained ones highlighted
        (:mod:`rlkit.notebook.conversation`); ``tokenizer`` as in :meth:`show`."""
        return conversation_view(self, index, tokenizer)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "tokenizer"}

    __repr__, _repr_html_ = trajectories_summary, trajectories_html


@dataclass(frozen=True)
class LossCounts:
    """Counts over the *global* batch (all microbatches, all data-parallel ranks).

    A loss function normalises by these instead of by its microbatch's own counts, so that summing the
    gradients of the microbatches gives exactly the gradient of the whole batch.
    """

    valid_tokens: int  # sum of loss_mask over the global batch
    valid_sequences: int  # sequences with at least one valid token
    num_sequences: int  # all sequences in the global batch
