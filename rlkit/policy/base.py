"""The Policy protocol: what every training backend offers the stages.

The in-process Megatron policy, a PyTorch-native one, and a Ray worker group all present this interface,
so stage and algorithm code never branch on the backend.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Protocol, runtime_checkable

import torch
from torch import Tensor

from rlkit.trajectories import LossCounts, Trajectories

HFGroup = list[tuple[str, Tensor]]  # HF-named tensors that must travel together (whole fused groups)

# loss_fn(logprobs [b, T] (with grad), microbatch, global counts) -> (scalar loss, metrics).
# Each metric is the microbatch's contribution normalised by the global counts, so sums are global values.
LossFn = Callable[[Tensor, Trajectories, LossCounts], tuple[Tensor, dict[str, Tensor]]]


@dataclass(frozen=True)
class TokenScores:
    """Per-token scores of given token ids, aligned with them (position 0 and padding hold 0)."""

    logprobs: Tensor  # [B, T] float32, log p(input_ids[:, t] | input_ids[:, :t])
    entropy: Tensor | None = None  # [B, T] float32, entropy of the distribution that predicted token t


@dataclass(frozen=True)
class TrainStepResult:
    """What one optimizer step did. ``metrics`` are global-batch values (summed loss-fn contributions)."""

    metrics: dict[str, float]
    grad_norm: float  # before clipping
    learning_rate: float  # the rate this step used
    num_microbatches: int
    version: int  # optimizer steps taken after this one
    timings: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class Policy(Protocol):
    """A trainable causal LM with HF-named weights."""

    version: int  # optimizer steps taken so far

    def score(self, input_ids: Tensor, attention_mask: Tensor, *, with_entropy: bool = False) -> TokenScores:
        """Per-token logprobs (and entropy) of ``input_ids`` [B, T] under the current weights."""
        ...

    def reference_score(self, input_ids: Tensor, attention_mask: Tensor) -> TokenScores:
        """Per-token logprobs under the frozen reference weights (no optimizer state of its own)."""
        ...

    def train_step(self, batch: Trajectories, loss_fn: LossFn) -> TrainStepResult:
        """One optimizer step over ``batch`` split into microbatches. All or nothing: an exception
        (KeyboardInterrupt included) before the update leaves weights and optimizer state untouched."""
        ...

    def export_hf_groups(self) -> Iterator[HFGroup]:
        """HF-named full tensors, one group (embeddings, a layer, the head) at a time."""
        ...

    def close(self) -> None: ...


@contextlib.contextmanager
def weights_swapped_in(module: torch.nn.Module, weights: Mapping[str, Tensor]):
    """Copy ``weights`` (parameter name -> tensor) into ``module`` for the block; the live weights come back
    afterwards, even if the block raises. How a policy scores with its frozen KL reference without keeping a
    second model or optimizer state."""
    params = dict(module.named_parameters())
    with torch.no_grad():
        live = {n: p.detach().clone() for n, p in params.items()}
        try:
            for n, p in params.items():
                p.copy_(weights[n])
            yield
        finally:
            for n, p in params.items():
                p.copy_(live[n])
