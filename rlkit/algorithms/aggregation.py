"""Loss aggregation: per-token values ``[b, T]`` -> one scalar, normalised by *global* counts.

Every aggregation divides a microbatch's sum by counts over the whole batch (``LossCounts``: all
microbatches, all data-parallel ranks), never by its own counts. Summing the microbatch results then gives
exactly the whole-batch value, and so does summing their gradients, whatever the microbatch split.

    token_mean           sum_{i,t} m_it x_it / valid_tokens                      (DAPO's token-level loss)
    seq_mean_token_mean  sum_i [ sum_t m_it x_it / |y_i| ] / valid_sequences     (original GRPO)
    seq_sum_constant     sum_{i,t} m_it x_it / (num_sequences * constant)       (Dr. GRPO, Liu et al. 2025)

``constant`` is a fixed length (Dr. GRPO uses the maximum generation length), so neither the length nor the
number of valid tokens of a sample changes its weight. A fully masked sequence contributes 0 everywhere and
is not a valid sequence; it still counts in ``num_sequences``.
"""

from __future__ import annotations

from typing import Optional, Protocol

import torch
from torch import Tensor

from rlkit.algorithms.params import AGGREGATION_NAMES, AggregationName
from rlkit.algorithms.registry import Registry
from rlkit.trajectories import LossCounts


class AggregationFn(Protocol):
    def __call__(
        self, values: Tensor, mask: Tensor, counts: LossCounts, constant: Optional[float] = None
    ) -> Tensor: ...


AGGREGATIONS: Registry[AggregationFn] = Registry(AGGREGATION_NAMES)


def count_valid(mask: Tensor) -> LossCounts:
    """``LossCounts`` of one (global) mask ``[B, T]``; sum these over ranks for a distributed batch."""
    mask = mask.bool()
    return LossCounts(
        valid_tokens=int(mask.sum()),
        valid_sequences=int(mask.any(dim=1).sum()),
        num_sequences=int(mask.shape[0]),
    )


def _masked(values: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask.bool(), values, 0.0)


@AGGREGATIONS.register("token_mean")
def token_mean(values: Tensor, mask: Tensor, counts: LossCounts, constant: Optional[float] = None) -> Tensor:
    """``sum_{i,t} m_it x_it / counts.valid_tokens``: every valid token weighs the same."""
    return _masked(values, mask).sum() / max(counts.valid_tokens, 1)


@AGGREGATIONS.register("seq_mean_token_mean")
def seq_mean_token_mean(values: Tensor, mask: Tensor, counts: LossCounts, constant: Optional[float] = None) -> Tensor:
    """``sum_i (sum_t m_it x_it / |y_i|) / counts.valid_sequences``: every valid sequence weighs the same."""
    per_seq = _masked(values, mask).sum(dim=1) / mask.bool().sum(dim=1).clamp(min=1)  # [b]
    return per_seq.sum() / max(counts.valid_sequences, 1)


@AGGREGATIONS.register("seq_sum_constant")
def seq_sum_constant(values: Tensor, mask: Tensor, counts: LossCounts, constant: Optional[float] = None) -> Tensor:
    """``sum_{i,t} m_it x_it / (counts.num_sequences * constant)`` (Dr. GRPO's length-unbiased sum)."""
    if constant is None or constant <= 0:
        raise ValueError("seq_sum_constant needs a positive constant (Dr. GRPO uses the max generation length): "
                         "set seq_sum_constant=<max_new_tokens>")
    return _masked(values, mask).sum() / (max(counts.num_sequences, 1) * constant)


def aggregate(
    name: AggregationName | AggregationFn,
    values: Tensor,  # [b, T]
    mask: Tensor,  # [b, T] bool
    counts: LossCounts,
    constant: Optional[float] = None,
) -> Tensor:  # 0-dim
    """Look up ``name`` (or use the callable) and reduce ``values``."""
    return AGGREGATIONS.get(name)(values, mask, counts, constant)
