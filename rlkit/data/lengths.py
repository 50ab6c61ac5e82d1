"""Prompts too long for a rollout, found when the data loads rather than at the first rollout.

A rollout renders each prompt with the chat template and asks the engine for ``max_new_tokens`` more; the
engine refuses a prompt longer than ``max_model_len - max_new_tokens`` (``PolicyConfig.max_prompt_tokens``).
Found there, the failure comes after SFT and evaluation, and does not say which row. Here every prompt is
rendered and tokenized exactly as the rollout stage does (``render_prompt_texts``), once, at load time
(about 1 s per 20k short prompts on 2 cores), and over-long rows are dropped with a warning that counts them
(``data.overlong_prompts=filter``) or refused with an error naming the first one (``=error``).
"""

from __future__ import annotations

import warnings
from typing import Any, Literal, Optional, Sequence

from rlkit.data.chat import render_prompts
from rlkit.errors import DataError

OverlongPrompts = Literal["filter", "error"]
_SHOW_CHARS = 80


def prompt_token_lengths(tokenizer: Any, prompts: Sequence[str], system_prompt: Optional[str] = None) -> list[int]:
    """Tokens of each prompt as the rollout stage feeds it to the engine (chat template, no extra specials)."""
    return [len(ids) for ids in render_prompts(tokenizer, list(prompts), system_prompt)]


def overlong_rows(
    prompts: Sequence[str],
    labels: Sequence[str],  # [rows] where each row came from ("line 7", "row 6"), for the messages
    source: str,  # the file or split, for the messages
    tokenizer: Any,
    max_prompt_tokens: int,
    system_prompt: Optional[str],
    mode: OverlongPrompts,
) -> list[int]:
    """Indices of the rows to keep (``filter``), after warning how many were dropped; ``error`` raises a
    ``DataError`` naming the first over-long row instead."""
    lengths = prompt_token_lengths(tokenizer, prompts, system_prompt)
    long = [i for i, n in enumerate(lengths) if n > max_prompt_tokens]
    if not long:
        return list(range(len(prompts)))
    first = long[0]
    shown = prompts[first] if len(prompts[first]) <= _SHOW_CHARS else prompts[first][:_SHOW_CHARS] + "..."
    limit = (f"the {max_prompt_tokens} tokens a rollout can take (the engine's max_model_len minus "
             "policy.generation.max_new_tokens)")
    if mode == "error":
        raise DataError([f"data.overlong_prompts=error: {source} {labels[first]} renders (chat template applied) to "
                         f"{lengths[first]} tokens, more than {limit}; prompt {shown!r}; {len(long)} such row(s) in "
                         "all. Fix: shorten or drop those rows, raise policy.max_total_sequence_length (or lower "
                         "max_new_tokens), or set data.overlong_prompts=filter to drop them"])
    warnings.warn(f"data: dropped {len(long)} of {len(prompts)} prompt(s) in {source} longer than {limit}; "
                  f"first: {labels[first]} ({lengths[first]} tokens, {shown!r}). Set data.overlong_prompts=error "
                  "to refuse them instead", UserWarning, stacklevel=4)
    return [i for i, n in enumerate(lengths) if n <= max_prompt_tokens]
