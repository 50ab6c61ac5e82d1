"""Copies of an in-process policy's state taken and put back without a checkpoint, and a gradient read out
without a step: what replaying a past step and forking a session need (:mod:`rlkit.run.replay`,
:mod:`rlkit.run.fork`).

Why here and not in the backends: the Megatron, DTensor and plain-transformers backends share the training loop
:class:`rlkit.policy.in_process.InProcessPolicy`, whose trainable parameters, optimizer and scheduler are
ordinary torch objects; copying them is the same code for all three, through its public API (``model``,
``optimizer``, ``reference``, ``grad_norm()``, ``sync_compute_copy()``). The state is the *trainable* parameters
only: with ``policy.lora_cfg`` on, the adapters (a few MB), else every weight.

Exactness: every copy is ``clone()``/``copy_()`` of fp32 tensors, so a state put back is bit for bit the one
taken, and a gradient computed at it is the one the step computed (same microbatches, same kernels).

Deliberate simplifications: the Ray worker group is not supported (its ranks hold the state; a snapshot would
gather and scatter it): :func:`require_in_process` refuses it with the reason. The KL reference is not part of a
state: every branch of a forked session shares the session's reference.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import Tensor

from rlkit.policy.base import LossFn
from rlkit.trajectories import Trajectories


def require_in_process(policy: Any, what: str) -> None:
    """Refuse a policy whose weights live in other processes (the Ray worker group), naming ``what`` needs them."""
    if getattr(policy, "model", None) is None or not hasattr(policy, "optimizer"):
        raise NotImplementedError(f"{what} needs the policy's weights in this process; the {type(policy).__name__} "
                                  "backend keeps them in its workers (run without Ray: cluster.enabled=false)")


def trainable(policy: Any) -> dict[str, Tensor]:
    """Name -> the trainable parameters themselves (adapters only when adapters are on)."""
    require_in_process(policy, "a weight snapshot")
    return {name: p for name, p in policy.model.named_parameters() if p.requires_grad}


def trainable_bytes(policy: Any) -> int:
    """Bytes one copy of the trainable parameters takes."""
    return sum(p.numel() * p.element_size() for p in trainable(policy).values())


@torch.no_grad()
def capture_weights(policy: Any) -> dict[str, Tensor]:
    """A copy of the trainable parameters (name -> tensor, same shapes, dtypes and device)."""
    return {name: p.detach().clone() for name, p in trainable(policy).items()}


@torch.no_grad()
def load_weights(policy: Any, weights: dict[str, Tensor]) -> None:
    """Copy ``weights`` (from :func:`capture_weights`) into the trainable parameters; a bf16 compute copy follows.
    The reference's bookkeeping is left alone: a swap in and back out leaves the policy as it was."""
    params = trainable(policy)
    if set(params) != set(weights):
        raise ValueError("the snapshot's parameters are not the policy's (was it taken under another "
                         "policy.lora_cfg?)")
    for name, p in params.items():
        p.copy_(weights[name])
    policy.sync_compute_copy()


@contextmanager
def weights_swapped_in(policy: Any, weights: dict[str, Tensor]) -> Iterator[None]:
    """The policy computes with ``weights`` inside the block; its own weights come back after, even on error."""
    own = capture_weights(policy)
    load_weights(policy, weights)
    try:
        yield
    finally:
        load_weights(policy, own)


@dataclass
class PolicyState:
    """Everything of a policy a branch owns: trainable weights, optimizer and schedule state, version."""

    weights: dict[str, Tensor]
    optimizer: dict[str, Any]  # optimizer.state_dict(), deep-copied
    scheduler: dict[str, Any]  # scheduler.state_dict(), deep-copied
    version: int

    @property
    def nbytes(self) -> int:
        """Bytes of tensors this state holds (weights and optimizer moments)."""
        tensors = list(self.weights.values()) + [v for s in self.optimizer["state"].values() for v in s.values()
                                                 if isinstance(v, Tensor)]
        return sum(t.numel() * t.element_size() for t in tensors)


def capture_state(policy: Any) -> PolicyState:
    """A copy of the policy's own state (:class:`PolicyState`); the policy is unchanged."""
    policy.restore_optimizer_state()
    return PolicyState(capture_weights(policy), copy.deepcopy(policy.optimizer.state_dict()),
                       copy.deepcopy(policy.scheduler.state_dict()), policy.version)


def load_state(policy: Any, state: PolicyState) -> None:
    """Make ``state`` the policy's: weights, optimizer moments, schedule and version (copies: ``state`` stays
    usable)."""
    policy.restore_optimizer_state()
    load_weights(policy, state.weights)
    policy.optimizer.load_state_dict(copy.deepcopy(state.optimizer))
    policy.scheduler.load_state_dict(copy.deepcopy(state.scheduler))
    policy.version = state.version
    policy.reference.is_current = False  # these weights are not the reference's (as after any update)


@dataclass(frozen=True)
class Gradient:
    """The gradient of a loss over a whole batch at the policy's current weights (no step taken)."""

    metrics: dict[str, float]  # the loss's global metrics, as train_step reports them
    norm: float  # the global gradient norm, as train_step reports it (before clipping)
    grads: dict[str, Tensor]  # name -> d loss / d parameter (trainable parameters), fp32 copies

    def cosine(self, other: "Gradient") -> float:
        """cos(angle) between this gradient and ``other`` (float64 sums; nan if either is 0)."""
        dot = sum(float((a.double() * other.grads[n].double()).sum()) for n, a in self.grads.items())
        norms = [sum(float(g.double().pow(2).sum()) for g in x.grads.values()) ** 0.5 for x in (self, other)]
        if norms[0] == 0 or norms[1] == 0:
            return float("nan")
        return max(-1.0, min(1.0, dot / (norms[0] * norms[1])))  # (equal gradients round to 1 + 2e-16)


def gradient(policy: Any, batch: Trajectories, loss_fn: LossFn) -> Gradient:
    """The gradient of ``loss_fn`` over ``batch`` at the current weights, computed as ``train_step`` computes it
    (same microbatches, same reductions, same norm), then cleared: weights, optimizer state and ``.grad`` are
    as before the call."""
    require_in_process(policy, "a gradient")
    metrics = policy.compute_gradients(batch, loss_fn)
    try:
        norm = policy.grad_norm()
        grads = {name: _full(p.grad).detach().float().clone() if p.grad is not None else
                 torch.zeros(p.shape, dtype=torch.float32) for name, p in trainable(policy).items()}
    finally:
        policy.optimizer.zero_grad(set_to_none=True)
    return Gradient(metrics, norm, grads)


def _full(value: Tensor) -> Tensor:
    """A DTensor's whole tensor (FSDP2 shards), a plain tensor as it is."""
    return value.full_tensor() if hasattr(value, "full_tensor") else value
