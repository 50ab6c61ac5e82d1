"""The norms of rlkit's Megatron layer spec (:func:`rlkit.policy.megatron.build.block_spec`), torch's RMSNorm built
from Megatron's norm arguments: the block's norms (also the post-norms of :mod:`rlkit.policy.megatron.post_norm`) and
Qwen3's per-head q/k norm."""

from __future__ import annotations

import torch


class RMSNorm(torch.nn.RMSNorm):
    """torch's RMSNorm, built from Megatron's norm arguments, that also works under sequence parallelism.

    Megatron's torch-norm wrapper refuses sequence parallelism because it does not mark the weight: with the
    sequence split over tensor-parallel ranks each rank's norm sees only its chunk, so the weight's gradient
    must be summed over the tensor-parallel group. The ``sequence_parallel`` attribute marks that (Megatron's
    router marks its weight the same way); Megatron's ``finalize_model_grads`` does the sum.
    """

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **unused_megatron_options):
        super().__init__(hidden_size, eps=eps)
        self.weight.sequence_parallel = config.sequence_parallel


class HeadRMSNorm(torch.nn.RMSNorm):
    """Qwen3's q/k norm: one RMSNorm weight [head_dim] shared by every head. Under tensor parallelism each rank
    normalises only its heads, so the weight's gradient is partial on every rank: Megatron's
    ``finalize_model_grads`` sums it over the tensor-parallel group (by its ``q_layernorm``/``k_layernorm`` name)."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **unused_megatron_options):
        super().__init__(hidden_size, eps=eps)
