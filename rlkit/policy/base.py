"""The backend contract: everything the session, the stages and the checkpoints ask of a policy.

Two classes implement all of it: the in-process training loop (:class:`rlkit.policy.in_process.InProcessPolicy`)
around one backend's model adapter (Megatron-Core, DTensor/FSDP2 or plain transformers:
:class:`rlkit.policy.adapter.ModelAdapter`), and the Ray worker group, which runs one loop per rank. What reads
more of an in-process policy (its public ``model``, ``optimizer``, ``reference``, ``grad_norm()``; never a private
name: ``tests/policy/test_composition.py``) is the what-if machinery (:mod:`rlkit.policy.snapshots`, per-token
gradients in :mod:`rlkit.stages.compare`), its checkpoint state (:mod:`rlkit.policy.state`) and the session card's
reference line, none of which a Ray worker group offers. What each side lets go of for a colocated engine is
declared here too and acted on by :class:`rlkit.weight_sync.Handoff` alone. The test
``tests/policy/test_contract.py`` runs every method against every backend.

Word use: a policy's *logprobs* are per-token log-probabilities of given tokens; *rewards* (the session's
``score`` stage) come from the environment, never from a policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping, Optional, Protocol, runtime_checkable

from torch import Tensor

from rlkit.config.components import OptimizerConfig, SchedulerConfig
from rlkit.trajectories import LossCounts, Trajectories
from rlkit.weights import HFGroup

# loss_fn(logprobs [b, T] (with grad), microbatch, global counts) -> (scalar loss, metrics).
# Each metric is the microbatch's contribution normalised by the global counts, so sums are global values.
LossFn = Callable[[Tensor, Trajectories, LossCounts], tuple[Tensor, dict[str, Tensor]]]


@dataclass(frozen=True)
class TokenLogprobs:
    """Per-token log-probabilities of given token ids, aligned with them (position 0 and padding hold 0)."""

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
    # With train_step(return_logprobs=True): the step's own forward (at the weights before its update).
    # Both [B, T], detached, 0 outside the completion, as the logprobs stage stores prev_logprobs and entropy.
    logprobs: Tensor | None = None
    entropy: Tensor | None = None


@runtime_checkable
class Policy(Protocol):
    """A trainable causal LM with HF-named weights, a frozen KL reference and its optimizer."""

    version: int  # optimizer steps taken so far; settable (a reset sets 0, a checkpoint restores it)
    returns_step_logprobs: bool  # whether train_step(return_logprobs=True) can return its forward's logprobs

    # ---- logprobs ---------------------------------------------------------------------------------
    def logprobs(self, input_ids: Tensor, attention_mask: Tensor, *, with_entropy: bool = False,
                 scored: Optional[Tensor] = None) -> TokenLogprobs:
        """Per-token logprobs (and entropy) [B, T] of right-padded ``input_ids`` [B, T] under the current weights;
        where ``scored`` [B, T] (bool, e.g. the loss mask) is False the values may be 0 (not computed)."""
        ...

    def reference_logprobs(self, input_ids: Tensor, attention_mask: Tensor, *,
                           scored: Optional[Tensor] = None) -> TokenLogprobs:
        """Per-token logprobs [B, T] under the frozen reference weights (``scored`` as in :meth:`logprobs`)."""
        ...

    # ---- training ---------------------------------------------------------------------------------
    def evaluate_loss(self, batch: Trajectories, loss_fn: LossFn) -> dict[str, float]:
        """The loss and its metrics on ``batch`` under the current weights; no gradients, no update."""
        ...

    def train_step(self, batch: Trajectories, loss_fn: LossFn, *, return_logprobs: bool = False) -> TrainStepResult:
        """One optimizer step over ``batch`` split into microbatches. All or nothing: an exception
        (KeyboardInterrupt included) before the update leaves weights and optimizer state untouched.

        ``return_logprobs`` (where ``returns_step_logprobs``): the result carries the step's own forward
        logprobs and entropy. On a batch without ``prev_logprobs``, rlkit's loss takes that forward (detached)
        as its old policy: exact for the only update on a batch, whose logprobs pass would compute the same
        values at these weights (TRL's on-policy rule), so ``Session.step()`` then skips the pass."""
        ...

    def reset_optimizer(self, optimizer: OptimizerConfig, scheduler: SchedulerConfig) -> None:
        """A fresh optimizer and learning-rate schedule (e.g. between an SFT warm start and RL)."""
        ...

    def set_reference_to_current(self) -> None:
        """Freeze the current weights as the KL reference."""
        ...

    def keep_reference(self, needed: bool) -> None:
        """Whether the KL reference is used (the session's ``needs_reference`` rule): held in memory only if so."""
        ...

    def reference_residency(self) -> str:
        """What the reference costs in memory now, and why, in words."""
        ...

    def offload_optimizer_state(self) -> None:
        """Move the optimizer state (and free the gradient buffers) to host memory while a colocated engine
        generates; the session's refit calls it when the engine sleeps between rollouts. Nothing happens where
        the weights live on the CPU already."""
        ...

    def release_gradient_buffers(self) -> None:
        """Free the gradient buffers until the next step (which reallocates them): what a policy on the CPU lets go
        of while a colocated engine that released its weights for the step rebuilds them and generates."""
        ...

    releases_base_while_generating: bool  # adapters: the frozen base is out while a colocated engine generates

    def release_frozen_base(self) -> int:
        """Free the frozen base weights until the next use reads them back from the model folder; the bytes freed."""
        ...

    def restore_optimizer_state(self) -> None:
        """Bring back what :meth:`offload_optimizer_state` moved. A policy does this by itself before anything
        that needs the state (a train step, a checkpoint save or load), so a caller never has to."""
        ...

    # ---- weights and state ------------------------------------------------------------------------
    def load_hf_state(self, hf: Mapping[str, Tensor]) -> None:
        """Load HF-named full tensors (each rank keeps its shard). Strict on names and shapes."""
        ...

    def reset_adapters(self) -> None:
        """With ``policy.lora_cfg``: the adapters back to their starting values; nothing without adapters."""
        ...

    def export_hf_groups(self) -> Iterator[HFGroup]:
        """HF-named full tensors, one fused group (embeddings, a layer, the head) at a time."""
        ...

    def hf_state_dict(self) -> dict[str, Tensor]:
        """Every HF-named full tensor, copied."""
        ...

    def save_state(self, folder: Path) -> None:
        """Weights, reference, optimizer and schedule into ``folder`` (a distributed checkpoint: every rank
        writes its own shard) with the parallel layout they were written under."""
        ...

    def load_state(self, folder: Path) -> None:
        """What :meth:`save_state` wrote, version included. A checkpoint of another parallel layout is refused
        before anything loads (:class:`rlkit.policy.state.CheckpointLayoutError`)."""
        ...

    def close(self) -> None: ...
