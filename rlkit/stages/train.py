"""Train stage: the loss and optimizer step(s) on a scored batch; loss(): the same numbers without a step.

With ``num_epochs`` > 1 or a global batch smaller than the rollout, the batch is split into minibatches
and the policy takes several steps against the stored ``prev_logprobs`` (PPO-style); the clipped ratio
keeps later steps near the policy that produced the data.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch

from rlkit.notebook.display import report_html
from rlkit.policy.base import LossFn, Policy, TrainStepResult
from rlkit.stages.settings import TrainSettings
from rlkit.trajectories import Trajectories


@dataclass(frozen=True)
class TrainResult:
    """What ``train()`` did: each optimizer step's result, their mean metrics, and the loss that made them."""

    steps: tuple[TrainStepResult, ...]  # one per optimizer step, in order
    metrics: dict[str, float]  # averaged over the optimizer steps
    seconds: float
    loss_fn: str = ""  # the loss and its key settings (loss_description): which loss these numbers are of

    @property
    def grad_norm(self) -> float:
        """Mean gradient norm over the optimizer steps (before clipping)."""
        return self.metrics["grad_norm"]

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v:.4g}" for k, v in self.metrics.items() if k in ("loss", "grad_norm", "clipped_fraction", "kl"))
        return f"TrainResult({len(self.steps)} step(s) of {self.loss_fn or '?'}, {shown}, {self.seconds:.2f}s)"

    def _repr_html_(self) -> str:
        return report_html(f"train: {len(self.steps)} optimizer step(s), {self.seconds:.2f} s", self.loss_fn,
                           self.metrics)


@dataclass(frozen=True)
class LossReport:
    """The loss and its metrics on a batch under the current weights (no step taken), and which loss it is:
    after ``configure(["loss_fn.policy_loss=gspo"])`` two reports can look alike, so each names its loss."""

    metrics: dict[str, float]
    policy_version: int
    loss_fn: str = ""  # the loss and its key settings (loss_description)

    def __repr__(self) -> str:
        return (f"LossReport(loss_fn={self.loss_fn or '?'}, "
                + ", ".join(f"{k}={v:.4g}" for k, v in self.metrics.items()) + ")")

    def _repr_html_(self) -> str:
        return report_html(f"loss at policy version {self.policy_version} (no step taken)", self.loss_fn,
                           self.metrics)


def loss_description(loss_fn: LossFn) -> str:
    """The loss by name with its key settings: an ``RLLoss`` describes itself (policy loss, clip range,
    aggregation, KL, correction); a loss of your own is named by its function or class name."""
    inner = getattr(loss_fn, "func", loss_fn)  # functools.partial: the function it wraps
    if hasattr(inner, "__name__"):  # a function
        return inner.__name__
    return repr(loss_fn) if type(loss_fn).__repr__ is not object.__repr__ else type(loss_fn).__name__


class TrainInterrupted(KeyboardInterrupt):
    """A KeyboardInterrupt (Ctrl-C, Jupyter's stop) during :func:`train` after ``applied`` optimizer step(s)
    took effect. The policy defers an interrupt that arrives during an update until the update is whole, so
    each step is applied or not; ``steps`` holds the results of the applied steps that returned (the step
    the interrupt surfaced in was applied, but its result is lost). Caught as a KeyboardInterrupt anywhere."""

    def __init__(self, applied: int, steps: tuple[TrainStepResult, ...], seconds: float):
        super().__init__(f"interrupted after {applied} optimizer step(s) were applied")
        self.applied, self.steps, self.seconds = applied, steps, seconds

    def metrics(self) -> dict[str, float]:
        """Mean metrics of the steps whose results are known, and ``interrupted`` = 1."""
        return dict(_mean_metrics(self.steps) if self.steps else {}, interrupted=1.0)


def _mean_metrics(steps: tuple[TrainStepResult, ...] | list[TrainStepResult]) -> dict[str, float]:
    keys = steps[0].metrics.keys()
    metrics = {k: sum(s.metrics[k] for s in steps) / len(steps) for k in keys}
    metrics["grad_norm"] = sum(s.grad_norm for s in steps) / len(steps)
    metrics["learning_rate"] = steps[-1].learning_rate
    return metrics


def _check_ready(batch: Trajectories) -> None:
    batch.require("advantages", "advantages()")
    batch.require("prev_logprobs", "logprobs()")


def loss(batch: Trajectories, policy: Policy, loss_fn: LossFn) -> LossReport:
    """The loss and its metrics under the current weights, without gradients or an update."""
    _check_ready(batch)
    return LossReport(policy.evaluate_loss(batch, loss_fn), policy.version, loss_description(loss_fn))


def one_update(batch_size: int, num_epochs: int = 1, global_batch_size: Optional[int] = None) -> bool:
    """Whether :func:`train` takes exactly one optimizer step on a batch of ``batch_size`` rows."""
    return num_epochs == 1 and (global_batch_size is None or global_batch_size >= batch_size)


def train(batch: Trajectories, policy: Policy, loss_fn: LossFn, settings: TrainSettings = TrainSettings(),
          seed: int = 0, on_policy: bool = False) -> TrainResult:
    """``settings.num_epochs`` passes over ``batch`` in minibatches of ``settings.global_batch_size`` rows shuffled
    with ``seed``, one optimizer step per minibatch. Returns every step's result and their mean metrics.

    ``on_policy``: ``batch`` has no ``prev_logprobs`` and gets one update, whose own forward is the loss's old
    policy and is returned (:meth:`rlkit.policy.base.Policy.train_step`); refused when there would be more.

    A KeyboardInterrupt after at least one update took effect surfaces as :class:`TrainInterrupted`, which
    says how many; one before any update is re-raised as it came (nothing changed).
    """
    num_epochs, global_batch_size = settings.num_epochs, settings.global_batch_size
    if not on_policy:
        _check_ready(batch)
    elif not one_update(batch.batch_size, num_epochs, global_batch_size):
        raise ValueError(f"on_policy training takes one update, but num_epochs={num_epochs} and global_batch_size="
                         f"{global_batch_size} over {batch.batch_size} rows take more: run the logprobs stage first")
    else:
        batch.require("advantages", "advantages()")
    t0 = time.perf_counter()
    version = policy.version
    size = global_batch_size or batch.batch_size
    generator = torch.Generator().manual_seed(seed)
    steps = []
    try:
        for epoch in range(num_epochs):
            order = torch.arange(batch.batch_size) if size == batch.batch_size else torch.randperm(batch.batch_size, generator=generator)
            for start in range(0, batch.batch_size, size):
                minibatch = batch if size == batch.batch_size else batch.select(order[start:start + size])
                steps.append(policy.train_step(minibatch, loss_fn, return_logprobs=on_policy))
    except KeyboardInterrupt as interrupt:
        applied = policy.version - version
        if applied <= 0:
            raise
        raise TrainInterrupted(applied, tuple(steps), time.perf_counter() - t0).with_traceback(
            interrupt.__traceback__) from None
    return TrainResult(tuple(steps), _mean_metrics(steps), time.perf_counter() - t0, loss_description(loss_fn))
