"""Shared helpers for the algorithm tests: a small ``Trajectories`` built straight from tensors."""

from __future__ import annotations

from typing import Optional

import pytest
import torch
from torch import Tensor

from rlkit.trajectories import Trajectories


def _make_batch(
    loss_mask: Tensor,  # [B, T] bool
    advantages: Tensor,  # [B, T]
    generator_logprobs: Tensor,  # [B, T]
    group_size: int = 1,
    prev_logprobs: Optional[Tensor] = None,
    ref_logprobs: Optional[Tensor] = None,
    entropy: Optional[Tensor] = None,
) -> Trajectories:
    b, t = loss_mask.shape
    return Trajectories(
        prompts=("p",) * b,
        completions=("c",) * b,
        input_ids=torch.zeros((b, t), dtype=torch.long),
        attention_mask=loss_mask.clone(),
        loss_mask=loss_mask,
        generator_logprobs=generator_logprobs,
        finish_reasons=("stop",) * b,
        group_size=group_size,
        policy_version=0,
        rewards=torch.zeros(b),
        advantages=advantages,
        prev_logprobs=prev_logprobs,
        ref_logprobs=ref_logprobs,
        entropy=entropy,
    )


@pytest.fixture
def make_batch():
    """``make_batch(loss_mask, advantages, generator_logprobs, ...) -> Trajectories``."""
    return _make_batch
