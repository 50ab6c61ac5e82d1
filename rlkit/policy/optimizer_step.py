"""The optimizer step every in-process policy backend shares: learning-rate schedule, Ctrl-C handling and
the all-or-nothing update (a notebook's stop button never leaves weights or optimizer state half updated)."""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time

import torch
import torch.distributed as dist
from torch import Tensor

from rlkit.config.components import SchedulerConfig
from rlkit.policy.base import LossFn, TrainStepResult
from rlkit.trajectories import Trajectories


def lr_lambda(cfg: SchedulerConfig):
    """Multiplier of the base learning rate at scheduler step ``s`` (warm-up, then the decay style)."""

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.decay_style == "constant" or cfg.decay_steps is None:
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / cfg.decay_steps)
        shape = 1 - progress if cfg.decay_style == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * shape

    return factor


@contextlib.contextmanager
def defer_keyboard_interrupt():
    """Hold a Ctrl-C / Jupyter stop until the block ends, so an optimizer update is never half applied."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = signal.signal(signal.SIGINT, lambda *args: received.append(args))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            raise KeyboardInterrupt


def all_or_nothing_step(policy, batch: Trajectories, loss_fn: LossFn) -> TrainStepResult:
    """One optimizer step of ``policy`` over ``batch``, shared by every in-process backend.

    All or nothing: gradients are accumulated first (``policy._run_microbatches``) and dropped if anything,
    a KeyboardInterrupt included, interrupts them; clipping, the optimizer and the scheduler update then
    run with Ctrl-C deferred, so weights and optimizer state are never half updated.
    """
    t0 = time.perf_counter()
    policy.model.train()
    policy.optimizer.zero_grad(set_to_none=True)
    try:
        metrics, n_micro = policy._run_microbatches(batch, loss_fn, backward=True)
        grad_norm = policy._grad_norm()
        if not math.isfinite(grad_norm):
            raise FloatingPointError(f"gradient norm is {grad_norm}; the step was skipped, weights unchanged")
    except BaseException:
        policy.optimizer.zero_grad(set_to_none=True)
        raise
    lr = policy.scheduler.get_last_lr()[0]
    with defer_keyboard_interrupt():
        if policy.cfg.max_grad_norm is not None and grad_norm > policy.cfg.max_grad_norm:
            scale = policy.cfg.max_grad_norm / (grad_norm + 1e-6)
            for p in policy.model.parameters():
                if p.grad is not None:
                    p.grad.mul_(scale)
        policy.optimizer.step()
        policy.scheduler.step()
        policy.optimizer.zero_grad(set_to_none=True)
        policy.version += 1
    return TrainStepResult(metrics=metrics, grad_norm=grad_norm, learning_rate=lr, num_microbatches=n_micro,
                           version=policy.version, timings={"train_step": time.perf_counter() - t0})


def sum_metrics_over_ranks(sums: dict[str, Tensor], group, device: torch.device) -> dict[str, float]:
    """Metric sums (float64 scalars) added up over ``group`` in one all-reduce (on ``device``: NCCL reduces
    device tensors only); unchanged for a group of one."""
    if sums and dist.get_world_size(group) > 1:
        keys = sorted(sums)
        packed = torch.stack([sums[k].to(device) for k in keys])
        dist.all_reduce(packed, group=group)
        sums = dict(zip(keys, packed))
    return {k: float(v) for k, v in sums.items()}


def sum_grad_over(param: Tensor, group) -> None:
    """Add ``param``'s gradient up over ``group``; a rank whose gradient is None (e.g. an expert no token
    reached) joins with zeros, so every rank takes part in the collective and applies the same update."""
    if param.grad is None:
        param.grad = torch.zeros_like(param)
    dist.all_reduce(param.grad, group=group)


class MicrobatchedTraining:
    """``compute_gradients``, ``evaluate_loss`` and ``train_step`` of an in-process backend, built on its
    ``_run_microbatches(batch, loss_fn, backward)``, ``model`` and ``optimizer`` (Megatron and DTensor)."""

    def compute_gradients(self, batch: Trajectories, loss_fn: LossFn) -> dict[str, float]:
        """Fill ``.grad`` of every parameter with the gradient of the global-batch loss; no update."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        metrics, _ = self._run_microbatches(batch, loss_fn, backward=True)
        return metrics

    def evaluate_loss(self, batch: Trajectories, loss_fn: LossFn) -> dict[str, float]:
        """The loss and its metrics on ``batch`` under the current weights, without gradients or update."""
        self.model.eval()
        metrics, _ = self._run_microbatches(batch, loss_fn, backward=False)
        return metrics

    def train_step(self, batch: Trajectories, loss_fn: LossFn) -> TrainStepResult:
        """One optimizer step over ``batch`` in microbatches of ``train_micro_batch_size`` rows (see
        :func:`all_or_nothing_step`: an interrupt never leaves a half-applied update)."""
        return all_or_nothing_step(self, batch, loss_fn)
