"""Each prompt computed once for its group of samples (``policy.megatron_cfg.share_prompts``).

Why: GRPO samples G completions of each prompt, and a train step or a logprobs pass over the rows [prompt |
completion] computes every prompt G times. With a chat model's system prompt the prompt is most of a short
reply's row (SmolLM2's ChatML prompt is ~50 tokens before a 32-token answer: 60% of the tokens a step multiplies),
so computing it once per group cuts the step's matmuls by about that share (docs/measurements.md).

Layout (:func:`share_prompts`): the rows whose tokens before their first scored token (the prompt) are the same
become one sequence ``[prompt | c_1 | ... | c_m]``, each completion ``c_j`` the rest of its row (up to its last real
token). RoPE positions run 0..P-1 over the prompt and P..P+L_j-1 over each completion, as in its own row; the
attention mask lets the prompt attend causally within itself and each completion attend to the prompt and to its
own earlier tokens, nothing else. So every position computes what it computes in its own row, in another order:
completion j's first token is predicted by the prompt's last position, its k-th by its own (k-1)-th. Padding
positions of a shorter group attend to themselves only (a fully masked row would put NaN into backward).

Deliberate simplifications: no tensor-sequence parallelism, pipeline or context parallelism, and no packing (the
policy falls back to its ordinary rows then, and wherever no two rows share a prompt); only the scored positions
get a logprob (the stage and the loss read no others).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
from torch import Tensor


@dataclass(frozen=True)
class SharedPrompts:
    """A batch of rows [B, T] laid out one sequence per prompt group: g groups of S positions."""

    input_ids: Tensor  # [g, S] token ids (0 on padding)
    positions: Tensor  # [g, S] RoPE positions: each token's position in its own row (0 on padding)
    mask: Tensor  # [g, 1, S, S] bool, True where attention is masked (Megatron's convention)
    source: Tensor  # [N, 2] (group, position) of the hidden state that predicts each scored token
    targets: Tensor  # [N] the scored tokens' ids
    where: Tensor  # [N, 2] (row, column) of each scored token in the [B, T] rows


def share_prompts(input_ids: Tensor, attention_mask: Tensor, scored: Tensor) -> Optional[SharedPrompts]:
    """Rows ``input_ids`` [B, T] (right-padded, ``attention_mask`` [B, T]) whose ``scored`` [B, T] positions are
    wanted, as one sequence per group of rows with the same prompt (the tokens before a row's first scored one);
    None when no two rows share a prompt (nothing to gain) or no row has a scored token."""
    lengths = attention_mask.sum(1).tolist()
    has_scored = scored.any(1)
    first = torch.where(has_scored, scored.int().argmax(1), 0).tolist()
    groups: dict[tuple[int, ...], list[int]] = {}
    for row in range(input_ids.shape[0]):
        if has_scored[row] and first[row] > 0:
            groups.setdefault(tuple(input_ids[row, :first[row]].tolist()), []).append(row)
    if not groups or all(len(rows) == 1 for rows in groups.values()):
        return None
    layouts = [_group_layout(input_ids, scored, rows, first[rows[0]], lengths) for rows in groups.values()]
    width = max(len(ids) for ids, *_ in layouts)
    g = len(layouts)
    ids = input_ids.new_zeros(g, width)
    positions = torch.zeros(g, width, dtype=torch.long)
    mask = torch.ones(g, 1, width, width, dtype=torch.bool)
    sources, targets, where = [], [], []
    for k, (row_ids, row_positions, row_mask, row_sources, row_targets, row_where) in enumerate(layouts):
        n = len(row_ids)
        ids[k, :n] = torch.tensor(row_ids, dtype=input_ids.dtype)
        positions[k, :n] = torch.tensor(row_positions)
        mask[k, 0, :n, :n] = row_mask
        padding = torch.arange(n, width)
        mask[k, 0, padding, padding] = False  # padding attends to itself only
        sources += [(k, p) for p in row_sources]
        targets += row_targets
        where += row_where
    return SharedPrompts(ids, positions, mask, torch.tensor(sources), torch.tensor(targets, dtype=input_ids.dtype),
                         torch.tensor(where))


def _group_layout(input_ids: Tensor, scored: Tensor, rows: list[int], prompt: int,
                  lengths: list[int]) -> tuple[list[int], list[int], Tensor, list[int], list[int], list[tuple]]:
    """One group's sequence: ids, RoPE positions, its [n, n] mask (True: masked), and for each scored token the
    position predicting it, its id and its (row, column)."""
    ids = input_ids[rows[0], :prompt].tolist()
    positions = list(range(prompt))
    blocks = []  # (start, length) of each completion in the sequence
    sources, targets, where = [], [], []
    for row in rows:
        start, length = len(ids), lengths[row] - prompt
        blocks.append((start, length))
        ids += input_ids[row, prompt:lengths[row]].tolist()
        positions += list(range(prompt, lengths[row]))
        for col in scored[row, prompt:lengths[row]].nonzero().squeeze(1).tolist():
            sources.append(prompt - 1 if col == 0 else start + col - 1)  # col: offset in the completion
            targets.append(int(input_ids[row, prompt + col]))
            where.append((row, prompt + col))
    n = len(ids)
    allowed = torch.zeros(n, n, dtype=torch.bool)
    allowed[:prompt, :prompt] = torch.ones(prompt, prompt, dtype=torch.bool).tril()
    for start, length in blocks:
        allowed[start:start + length, :prompt] = True
        allowed[start:start + length, start:start + length] = torch.ones(length, length, dtype=torch.bool).tril()
    return ids, positions, ~allowed, sources, targets, where


@contextlib.contextmanager
def rope_at(gpt, positions: Tensor) -> Iterator[None]:
    """While open, Megatron's ``GPTModel`` ``gpt`` rotates each token by its own position ``positions`` [b, s]
    instead of its index in the sequence: the rotary embedding returns [s, b, 1, dim] (one angle per token and row)
    where it returns [s, 1, 1, dim] for positions 0..s-1, which ``apply_rotary_pos_emb`` broadcasts the same way."""
    rope = gpt.rotary_pos_emb

    def per_token(*args, **kwargs) -> Tensor:
        emb = rope.get_emb(int(positions.max()) + 1)  # [P, 1, 1, dim]
        return emb[:, 0, 0][positions.t().to(emb.device)].unsqueeze(2)

    rope.forward = per_token  # (an instance attribute: shadows the class's cached forward while open)
    try:
        yield
    finally:
        del rope.forward
