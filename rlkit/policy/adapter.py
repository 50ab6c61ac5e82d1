"""What a training backend supplies: its model behind :class:`ModelAdapter`, the one interface the training loop
(:class:`rlkit.policy.in_process.InProcessPolicy`) calls. The loop holds an adapter and calls it; an adapter never
calls back (it is handed what it needs: the temperature for a fused head, the loop's functions for a pipeline).
An adapter subclasses the protocol to take the defaults of its optional members, and may subclass one other
adapter (DTensor is the ``hf`` adapter sharded, Megatron's MoE the Megatron one).
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Mapping, Optional, Protocol

import torch
from torch import Tensor

from rlkit.config.components import PolicyConfig
from rlkit.policy.packing import PackedRows, pack_rows
from rlkit.weights import HFGroup

Scores = tuple[Tensor, Optional[Tensor]]  # logprobs [b, t] (position 0: 0), entropy [b, t] or None


class ModelAdapter(Protocol):
    """A backend's model, built and loaded: its forward pass, scores, gradients and weight names."""

    cfg: PolicyConfig
    model: Optional[torch.nn.Module]  # what the optimizer, checkpoints and refit see (fp32 masters at bf16)
    device: torch.device  # the model's; batches and results stay where the caller keeps them
    # rank facts a Ray worker reports: data-parallel rank and size, first rank of its data-parallel group
    dp_rank, dp_size, leader = 0, 1, True
    pipeline = None  # a microbatch runner over pipeline stages (rlkit.policy.megatron.pipeline); None: the loop's
    twin = None  # a bf16 copy computing for the fp32 masters in ``model`` (rlkit.policy.precision.Bf16Twin)
    frozen_base = None  # under adapters, the base while it can be released (rlkit.policy.frozen_base.FrozenBase)
    holds_process_group = False  # set by an adapter that acquired the default group; close() releases it

    def rows_group(self):
        """The process group whose ranks hold different rows of a batch; None: this process alone."""

    def logits(self, input_ids: Tensor) -> Tensor:
        """input_ids [b, t] -> logits [b, t, V] (or this rank's [b, t, V/tp])."""

    def packed_logits(self, packed: PackedRows) -> Tensor:
        """Rows packed into one sequence -> logits [1, L, V(/tp)], each row attending only within itself."""

    def token_logprobs_and_entropy(self, logits: Tensor, input_ids: Tensor, with_entropy: bool) -> Scores:
        """Logits [b, t, V(/tp)] and ids [b, t] -> logprobs [b, t], differentiable; with ``with_entropy`` the
        entropy [b, t] of the distribution that predicted each token (no gradient), else None."""

    def fused_scores(self, input_ids: Tensor, with_entropy: bool, temperature: float, packed: Optional[PackedRows],
                     scored: Optional[Tensor]) -> Optional[Scores]:
        """Scores of ``input_ids`` [b, t] (or of the ``packed`` rows) at ``temperature`` from a head fused with them
        (0 allowed where ``scored`` [b, t] is False); None: the loop scores the full logits."""
        return None

    def shared_prompt_scores(self, input_ids: Tensor, attention_mask: Tensor, with_entropy: bool, scored: Tensor,
                             temperature: float) -> Optional[list[Tensor]]:
        """[logprobs(, entropy)] [b, T] from one pass computing each group's shared prompt once; None: not done."""
        return None

    def agreed_length(self, t: int) -> int:
        """The forward length when this rank's rows need ``t`` columns (ranks that must run equal lengths agree)."""
        return t

    def pack(self, input_ids: Tensor, attention_mask: Tensor) -> PackedRows:
        """The rows of ``input_ids`` [b, T] (real tokens where ``attention_mask`` [b, T]) packed into one sequence."""
        return pack_rows(input_ids, attention_mask.sum(1).tolist())

    def microbatch_starting(self, index: int, count: int) -> None:
        """Called before the backward microbatch ``index`` of ``count`` (FSDP: sync gradients on the last)."""

    def reduce_grads(self) -> None:
        """Sum gradients over the ranks that hold the same weights (FSDP does it during backward)."""

    def grad_norm(self) -> float:
        """The global gradient norm over every rank's (sharded) gradients."""

    def release_gradient_buffers(self) -> None:
        """Free the gradient buffers kept between steps, if any (contents dropped)."""

    def reallocate_gradient_buffers(self) -> None:
        """Allocate (zeroed) what :meth:`release_gradient_buffers` freed."""

    def copy_hf_state(self, hf: Mapping[str, Tensor]) -> None:
        """Copy HF-named full tensors into the model (this rank's shards); strict on names and shapes."""

    def export_hf_groups(self) -> Iterator[HFGroup]:
        """HF-named full tensors, one fused group (embeddings, a layer, the head) at a time, adapters merged."""

    def checkpoint_names(self) -> dict[str, str]:
        """Parameter name on this rank -> its name in a checkpoint, unique for every distinct shard."""

    def parallel_layout(self) -> dict[str, int | str | bool | None]:
        """The layout a checkpoint's shards are cut by (a checkpoint loads only under the same one)."""

    def adapters_disabled(self) -> contextlib.AbstractContextManager:
        """With ``policy.lora_cfg``: the base model computes inside the block (the KL reference)."""

    def export_adapter_tensors(self) -> Iterator[tuple[str, Tensor]]:
        """The adapters as full tensors under their PEFT file names (a collective: every rank calls)."""

    def release_frozen_base(self) -> int:
        """Free the frozen base until its next use reads it back from the model folder; the bytes freed."""
        raise NotImplementedError(f"{type(self).__name__} cannot release its frozen base; "
                                  "policy.lora_cfg.release_base_while_generating is built for the megatron backend")

    def own_generator(self, cfg, max_model_len: int, seed: int):
        """A generator that samples from this model's own weights (an engine whose record in
        :mod:`rlkit.config.engines` says ``on_policy_weights``); validation keeps other backends from asking."""
        raise NotImplementedError(f"{type(self).__name__} has no generator on its own weights; "
                                  "policy.generation.backend=megatron is built for the megatron backend")

    def close(self) -> None:
        """Release the model and this adapter's hold on the default process group (:mod:`rlkit.policy.process_group`)."""
        from rlkit.policy.process_group import release_process_group

        self.model = self.twin = None
        if self.holds_process_group:
            self.holds_process_group = False
            release_process_group()
