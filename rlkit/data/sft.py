"""Supervised warm-start batches: rendered prompt, then the reference response and EOS, loss on the response.

A tiny model starts RL with near-zero reward on every prompt, so no group has reward variance and GRPO has
nothing to learn from. A few SFT steps on the reference answers fix that. The batch follows the padding
convention of ``rlkit.trajectories``: prompt then response, right-padded, and ``loss_mask`` True exactly on
the tokens the model is trained to produce (the response and the EOS that ends the turn), so the same loss
code and ``Trajectories`` helpers apply.

The response is tokenized on its own, after the rendered prompt, as the generator would produce it (a BPE
tokenizer could merge differently across the boundary if prompt and response were tokenized together).

Deliberate simplifications: no truncation (keep prompts and answers short or filter the rows first); one
response per row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, NamedTuple, Optional, Sequence

from rlkit.data.chat import render_prompts
from rlkit.errors import ModelError

if TYPE_CHECKING:  # torch is imported where a batch is built: rlkit.data loads with the config, which needs no torch
    from torch import Tensor


class SFTBatch(NamedTuple):
    """Unpacks as ``input_ids, attention_mask, loss_mask = build_sft_batch(...)``."""

    input_ids: Tensor  # [B, T] int64, prompt + response + EOS, right-padded with pad_token_id
    attention_mask: Tensor  # [B, T] bool, True on real tokens
    loss_mask: Tensor  # [B, T] bool, True on response tokens and the EOS


def build_sft_batch(
    tokenizer: Any,
    rows: list[dict[str, Any]],
    response_key: str = "answer",
    prompt_key: str = "prompt",
    system_prompt: Optional[str] = None,
    tools: Optional[Sequence[dict[str, Any]]] = None,  # JSON tool declarations rendered into the prompt
    template_kwargs: Optional[Mapping[str, Any]] = None,  # data.chat_template_kwargs
) -> SFTBatch:
    """One right-padded batch from ``rows[i][prompt_key]`` and ``rows[i][response_key]``."""
    import torch

    if not rows:
        raise ValueError("build_sft_batch needs at least one row")
    for name in ("eos_token_id", "pad_token_id"):
        if getattr(tokenizer, name, None) is None:
            raise ModelError(f"the tokenizer has no {name}, which SFT batches need; set tokenizer."
                             f"{name.removesuffix('_id')} (e.g. to its EOS token) before building the batch")
    for i, row in enumerate(rows):
        if prompt_key not in row or response_key not in row:
            raise ValueError(f"row {i} needs {prompt_key!r} and {response_key!r}; it has {sorted(row)}")
    prompt_ids = render_prompts(tokenizer, [str(row[prompt_key]) for row in rows], system_prompt, tools, template_kwargs)
    response_ids = [
        tokenizer.encode(str(row[response_key]), add_special_tokens=False) + [tokenizer.eos_token_id] for row in rows
    ]
    ends = [len(p) + len(r) for p, r in zip(prompt_ids, response_ids)]
    length = max(ends)
    input_ids = torch.tensor([p + r + [tokenizer.pad_token_id] * (length - end)
                              for p, r, end in zip(prompt_ids, response_ids, ends)], dtype=torch.int64)
    positions = torch.arange(length)
    attention_mask = positions < torch.tensor(ends).unsqueeze(1)
    loss_mask = attention_mask & (positions >= torch.tensor([len(p) for p in prompt_ids]).unsqueeze(1))
    return SFTBatch(input_ids, attention_mask, loss_mask)
