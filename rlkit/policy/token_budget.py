"""Microbatches cut by a token budget instead of a fixed row count (NeMo-RL's dynamic batching).

Why: a microbatch is padded to its longest row, so a fixed row count mixes short and long rows and pays for
the padding (math answers run from 16 to 512 tokens). Sorting the rows by length and filling each microbatch
up to ``max_tokens`` padded tokens (rows x longest row, the longest rounded up to ``round_to``) puts rows of
similar length together: fewer padded positions, and a memory ceiling in tokens rather than rows.

The result is a plan (lists of row indices), not a new batch: the policy's microbatch loop runs it, and the
loss stays normalised by the global counts, so the summed gradient equals the padded path's up to float
summation order (tests/policy/test_token_budget.py: <= 1e-6).

Ranks that hold different rows (data parallelism) must run the same number of forward passes, because a
sharded model's forward is a collective (FSDP all-gathers weights, Megatron's TP all-reduces): each rank's
plan is split further until every rank has the largest count of the group (:func:`equal_count_over`).
"""

from __future__ import annotations

from typing import Literal, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from rlkit.config.components import PolicyConfig
from rlkit.policy.packing import packing_plan


def round_up(length: int, round_to: int) -> int:
    """``length`` rounded up to a multiple of ``round_to``."""
    return -(-length // round_to) * round_to


def token_budget_plan(lengths: Sequence[int], max_tokens: int, round_to: int = 1) -> list[list[int]]:
    """Row indices of each microbatch: rows sorted by length (longest first) fill a microbatch while
    ``rows * rounded longest length <= max_tokens``. A row longer than the budget gets a microbatch of its
    own. Each microbatch lists its rows in ascending order; the plan covers every row exactly once."""
    if max_tokens < 1 or round_to < 1:
        raise ValueError(f"max_tokens={max_tokens} and round_to={round_to} must be >= 1")
    plan: list[list[int]] = []
    width = 0  # padded length of the open microbatch: its first (longest) row's
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        length = round_up(max(int(lengths[i]), 1), round_to)
        if plan and (len(plan[-1]) + 1) * width <= max_tokens:
            plan[-1].append(i)
        else:
            plan.append([i])
            width = length
    return [sorted(rows) for rows in plan]


def split_to_count(plan: list[list[int]], count: int) -> list[list[int]]:
    """``plan`` with its largest microbatches halved until it has ``count`` of them (more forward passes on
    this rank to match another rank's; each still within its budget). Needs ``count <= rows``."""
    plan = [list(rows) for rows in plan]
    if count > sum(len(rows) for rows in plan):
        raise ValueError(f"cannot split {sum(map(len, plan))} rows into {count} microbatches")
    while len(plan) < count:
        largest = max(range(len(plan)), key=lambda k: len(plan[k]))
        rows = plan.pop(largest)
        plan[largest:largest] = [rows[: len(rows) // 2], rows[len(rows) // 2:]]
    return plan


def equal_count_over(plan: list[list[int]], group, device: torch.device) -> list[list[int]]:
    """``plan`` split until it has as many microbatches as the longest plan in ``group`` (unchanged for a
    group of one). Every rank of the group must call it."""
    if group is None or dist.get_world_size(group) == 1:
        return plan
    count = torch.tensor([len(plan)], device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX, group=group)
    return split_to_count(plan, int(count))


def padded_tokens(plan: list[list[int]], lengths: Sequence[int]) -> int:
    """Positions a forward pass over ``plan`` computes: rows x longest row, summed over microbatches."""
    return sum(len(rows) * max(int(lengths[i]) for i in rows) for rows in plan)


def row_count_plan(num_rows: int, rows_per_microbatch: int) -> list[list[int]]:
    """The fixed plan: consecutive rows, ``rows_per_microbatch`` at a time (the last may be shorter)."""
    return [list(range(s, min(s + rows_per_microbatch, num_rows))) for s in range(0, num_rows, rows_per_microbatch)]


def as_index(rows: list[int]) -> slice | Tensor:
    """A slice for consecutive rows (a view, no copy), an index tensor otherwise."""
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return slice(rows[0], rows[0] + len(rows))
    return torch.tensor(rows)


def microbatch_plan(cfg: PolicyConfig, attention_mask: Tensor, rows_per_microbatch: int,
                    budget_key: Literal["train_mb_tokens", "logprob_mb_tokens"], group,
                    device: torch.device) -> list[slice | Tensor]:
    """The rows of each forward pass over ``attention_mask`` [B, T]: ``rows_per_microbatch`` consecutive rows at a
    time; with ``policy.dynamic_batching`` rows of similar length up to a budget of padded tokens; with
    ``policy.sequence_packing`` packs of rows up to a budget of tokens (:mod:`rlkit.policy.packing`). The budget is
    the enabled section's ``budget_key`` (default: ``rows_per_microbatch`` x ``max_total_sequence_length``). As many
    passes on every rank of ``group`` (the ranks holding different rows; ``device``: where the count is reduced)."""
    dynamic, packing = cfg.dynamic_batching, cfg.sequence_packing
    if not (dynamic.enabled or packing.enabled):
        return [as_index(rows) for rows in row_count_plan(attention_mask.shape[0], rows_per_microbatch)]
    section = packing if packing.enabled else dynamic
    budget = getattr(section, budget_key) or rows_per_microbatch * cfg.max_total_sequence_length
    lengths = attention_mask.sum(1).tolist()
    plan = (packing_plan(lengths, budget) if packing.enabled
            else token_budget_plan(lengths, budget, dynamic.sequence_length_round))
    return [as_index(rows) for rows in equal_count_over(plan, group, device)]
