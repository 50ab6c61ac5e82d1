"""Prompts too long for a rollout, found when the data loads rather than at the first rollout.

A rollout renders each prompt with the chat template and asks the engine for ``max_new_tokens`` more; the
engine refuses a prompt longer than ``max_model_len - max_new_tokens`` (``PolicyConfig.max_prompt_tokens``).
Found there, the failure comes after SFT and evaluation, and does not say which row. Here every prompt is
rendered and tokenized exactly as the rollout stage does (``render_prompt_texts``), once, at load time, and
over-long rows are dropped with a warning that counts them (``data.overlong_prompts=filter``) or refused with
an error naming the first one (``=error``).
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Literal, Mapping, Optional, Sequence

import pyarrow.compute as pc

from rlkit.data.chat import render_prompts
from rlkit.errors import DataError

OverlongPrompts = Literal["filter", "error"]
_SHOW_CHARS = 80


def prompt_token_lengths(tokenizer: Any, prompts: Sequence[str], system_prompt: Optional[str] = None,
                         template_kwargs: Optional[Mapping[str, Any]] = None,
                         tools: Optional[Sequence[Mapping[str, Any]]] = None) -> list[int]:
    """Tokens of each prompt as the rollout stage feeds it to the engine (chat template with the JSON ``tools``
    it declares, no extra specials)."""
    return [len(ids) for ids in render_prompts(tokenizer, list(prompts), system_prompt, tools, template_kwargs)]


def max_token_chars(tokenizer: Any) -> int:
    """The most characters one token of ``tokenizer`` can stand for (its longest vocabulary entry, at least 1).

    A byte-level BPE entry is written one character per byte, and a text character is at least one byte, so
    no token covers more characters of a text than its entry has. Hence a text of more than
    ``max_tokens * max_token_chars`` characters is certainly longer than ``max_tokens`` tokens, which is known
    without tokenizing it (rendering and tokenizing a huge prompt costs minutes and gigabytes)."""
    cached = getattr(tokenizer, "_rlkit_max_token_chars", None)
    if cached is None:
        cached = max((len(token) for token in tokenizer.get_vocab()), default=1) or 1
        with contextlib.suppress(AttributeError):  # a tokenizer that takes no attributes: computed again next time
            tokenizer._rlkit_max_token_chars = cached
    return cached


def overlong_rows(
    prompts: Sequence[str],
    labels: Sequence[str],  # [rows] where each row came from ("line 7", "row 6"), for the messages
    source: str,  # the file or split, for the messages
    tokenizer: Any,
    max_prompt_tokens: int,
    system_prompt: Optional[str],
    mode: OverlongPrompts,
    template_kwargs: Optional[Mapping[str, Any]] = None,  # data.chat_template_kwargs
    tools: Optional[Sequence[Mapping[str, Any]]] = None,  # the JSON tools every rollout renders into the prompt
) -> list[int]:
    """Indices of the rows to keep (``filter``), after warning how many were dropped; ``error`` raises a
    ``DataError`` naming the first over-long row instead.

    A prompt whose raw text alone has more characters than ``max_prompt_tokens`` tokens can stand for
    (:func:`max_token_chars`) is over-long without being rendered or tokenized; only the others are."""
    char_limit = max_prompt_tokens * max_token_chars(tokenizer)
    lengths: list[Optional[int]] = [None] * len(prompts)  # None: over-long by its characters alone
    measured = [i for i, p in enumerate(prompts) if len(p) <= char_limit]
    for i, n in zip(measured, prompt_token_lengths(tokenizer, [prompts[i] for i in measured], system_prompt,
                                                               template_kwargs, tools)):
        lengths[i] = n
    long = [i for i, n in enumerate(lengths) if n is None or n > max_prompt_tokens]
    if not long:
        return list(range(len(prompts)))
    first = long[0]
    shown = prompts[first] if len(prompts[first]) <= _SHOW_CHARS else prompts[first][:_SHOW_CHARS] + "..."
    size = (f"{lengths[first]} tokens" if lengths[first] is not None else
            f"{len(prompts[first])} characters, more than {max_prompt_tokens} tokens of at most "
            f"{max_token_chars(tokenizer)} characters each hold, so not tokenized")
    limit = (f"the {max_prompt_tokens} tokens a rollout can take (the engine's max_model_len minus "
             "policy.generation.max_new_tokens)")
    if mode == "error":
        renders = "renders (chat template applied) to" if lengths[first] is not None else "has"
        raise DataError([f"data.overlong_prompts=error: {source} {labels[first]} {renders} {size}, more than "
                         f"{limit}; prompt {shown!r}; {len(long)} such row(s) in "
                         "all. Fix: shorten or drop those rows, raise policy.max_total_sequence_length (or lower "
                         "max_new_tokens), or set data.overlong_prompts=filter to drop them"])
    warnings.warn(f"data: dropped {len(long)} of {len(prompts)} prompt(s) in {source} longer than {limit}; "
                  f"first: {labels[first]} ({size}, {shown!r}). Set data.overlong_prompts=error "
                  "to refuse them instead", UserWarning, stacklevel=4)
    return sorted(set(range(len(prompts))) - set(long))


def empty_rows(prompts: Any, labels: Sequence[str], source: str) -> list[int]:
    """Indices of the rows whose prompt has text, after warning how many empty (or whitespace-only) prompts were
    dropped: an empty prompt asks the model nothing, and its samples would only add noise to their group.
    ``prompts``: an Arrow string array (checked in Arrow: 1M prompts in milliseconds)."""
    blank = pc.equal(pc.utf8_trim_whitespace(prompts), "")
    empty = pc.indices_nonzero(pc.fill_null(blank, True)).to_pylist()
    if not empty:
        return list(range(len(prompts)))
    warnings.warn(f"data: dropped {len(empty)} of {len(prompts)} prompt(s) in {source} that are empty or only "
                  f"whitespace; first: {labels[empty[0]]}. Fix: remove those rows (or fill in their prompts)",
                  UserWarning, stacklevel=4)
    return sorted(set(range(len(prompts))) - set(empty))
