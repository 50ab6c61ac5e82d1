"""bf16 compute with fp32 master weights for a policy whose optimizer cannot keep them itself.

Mixed precision the way Megatron-Core's ``Float16Module`` + ``DistributedDataParallel`` + mixed-precision
optimizer do it: forward and backward run on bf16 weights, gradients are accumulated over microbatches and
reduced in fp32, the optimizer updates fp32 master weights with fp32 state, and the bf16 weights are then
refreshed from the masters. An update far below bf16's resolution (a step of 1e-4 on a weight of 1.0, whose
bf16 neighbours are 2^-7 apart) is kept in the master and reaches the bf16 copy once the updates add up.

Here the fp32 master is the policy's ``model`` (what the optimizer, checkpoints, weight export and refit see,
so all of them are unchanged) and :class:`Bf16Twin` holds its bf16 copy, which Megatron's
``DistributedDataParallel`` wraps: it accumulates the bf16 gradients into its fp32 ``main_grad`` buffers and
reduces them in fp32, and the policy hands those to the masters as their ``.grad``. Megatron's own
mixed-precision optimizer would keep the masters instead, but it allocates its CUDA buffers with literal
``device="cuda"`` and checks ``torch.cuda.*Tensor`` types (megatron-core 0.16.1 ``optimizer/optimizer.py:473-485,
671-699``), so it cannot run on a CPU; this path runs on both.

The DTensor backend needs none of this: FSDP2's ``MixedPrecisionPolicy`` keeps the sharded parameters fp32,
gathers them in bf16 for compute and reduces gradients in fp32 (:func:`fsdp_mixed_precision`).
"""

from __future__ import annotations

from typing import Literal

import torch

Precision = Literal["float32", "bfloat16"]


def fsdp_mixed_precision(precision: Precision, pure_bf16: bool = False):
    """FSDP2's policy for ``policy.precision``: for bf16, parameters gathered in bf16 for compute (the sharded
    fp32 ones are the master weights the optimizer updates) and gradients reduced in fp32; for fp32, and for
    ``pure_bf16`` (the sharded parameters are bf16 themselves, ``policy.pure_bf16``), FSDP's default (no casts)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision == "float32" or pure_bf16:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


class Bf16Twin:
    """The bf16 copy of an fp32 master module that runs forward and backward.

    ``master`` and ``compute`` have the same parameter names and shapes; ``pairs`` lists (fp32, bf16) per
    parameter that keeps an fp32 master (every one, or with ``share_frozen`` those that train). The gradients of the bf16 copy go to Megatron's DDP (fp32 ``main_grad``), which the
    policy hands to the masters. :meth:`pull` copies the masters into the bf16 weights (after an optimizer step,
    a load, a checkpoint restore).

    ``share_frozen``: a frozen parameter (under adapters, the whole base) is held once, in bf16: the master's
    parameter becomes the bf16 copy's own tensor (rounded once from the fp32 value, as :meth:`pull` would), so
    the base costs 2 bytes per parameter instead of 4 + 2. A frozen parameter receives no update for an fp32
    master to keep, and loads, exports and the refit read the bf16 weights the model computes with.
    """

    def __init__(self, master: torch.nn.Module, compute: torch.nn.Module, share_frozen: bool = False):
        masters = dict(master.named_parameters())
        computes = dict(compute.named_parameters())
        if masters.keys() != computes.keys():
            differ = sorted(masters.keys() ^ computes.keys())[:5]
            raise ValueError(f"the bf16 copy's parameters differ from the master's: {differ}")
        self.pairs = []
        for name, fp32 in masters.items():
            bf16 = computes[name]
            if fp32.dtype != torch.float32:
                raise ValueError(f"master weights must be float32, got {fp32.dtype}")
            bf16.requires_grad_(fp32.requires_grad)  # (a frozen MoE router stays frozen)
            if fp32.untyped_storage().nbytes():  # (a shared frozen one freed before loading has nothing to copy)
                with torch.no_grad():
                    bf16.copy_(fp32)
            if share_frozen and not fp32.requires_grad:
                owner, _, leaf = name.rpartition(".")
                setattr(master.get_submodule(owner), leaf, bf16)
            else:
                self.pairs.append((fp32, bf16))
        self.compute = compute

    @torch.no_grad()
    def pull(self) -> None:
        """bf16 weights <- fp32 master weights (round to nearest)."""
        for fp32, bf16 in self.pairs:
            bf16.copy_(fp32)
