"""The optimizer a policy trains with: AdamW and its learning-rate schedule, and its state's offload to host memory.

Why an offload: while a colocated engine generates, AdamW's fp32 ``exp_avg`` and ``exp_avg_sq`` (2x the parameters)
are not needed on the accelerator; :meth:`rlkit.policy.in_process.InProcessPolicy.offload_optimizer_state` moves
them to host memory with :func:`offload_state` and back with :func:`restore_state`.
"""

from __future__ import annotations

import math
from typing import Iterable, NamedTuple, Optional

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

from rlkit.config.components import OptimizerConfig, SchedulerConfig


def adamw(params: Iterable[Tensor], optimizer: OptimizerConfig,
          scheduler: SchedulerConfig) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """A fresh AdamW over ``params`` and its learning-rate schedule (:func:`lr_lambda`)."""
    adam = torch.optim.AdamW(list(params), lr=optimizer.lr, betas=optimizer.betas, eps=optimizer.eps,
                             weight_decay=optimizer.weight_decay)
    return adam, torch.optim.lr_scheduler.LambdaLR(adam, lr_lambda(scheduler))


SQUARES_CHUNK = 2**22  # elements of a gradient squared at once in float64 (32 MB)


def sum_of_squares(grad: Tensor) -> Tensor:
    """sum(grad ** 2) as a float64 scalar, :data:`SQUARES_CHUNK` elements at a time: squaring a gradient as large as
    Qwen3-0.6B's tied embedding (156M elements) whole would take two float64 copies of it, 2.5 GB, at once."""
    total = torch.zeros((), dtype=torch.float64, device=grad.device)
    for piece in grad.reshape(-1).split(SQUARES_CHUNK):
        total += piece.double().pow(2).sum()
    return total


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


class HostCopy(NamedTuple):
    """One optimizer state tensor while it is offloaded: its (local shard's) copy in host memory, and for a
    DTensor (FSDP2's state) what rebuilds it around that shard on the way back."""

    host: Tensor  # same shape, dtype and strides as the (local) tensor; pinned when CUDA is present
    dtensor_layout: Optional[tuple]  # (device_mesh, placements, shape, stride) of a DTensor; None for a plain tensor

    @classmethod
    def of(cls, value: Tensor, pin: bool) -> "HostCopy":
        """Copy ``value`` into new host memory (a DTensor's local shard only: a DTensor built around a host
        tensor is moved back to its mesh's device by ``DTensor.from_local``)."""
        if isinstance(value, DTensor):
            local, layout = value.to_local(), (value.device_mesh, value.placements, value.shape, value.stride())
        else:
            local, layout = value, None
        host = torch.empty_like(local, device="cpu", pin_memory=pin)
        host.copy_(local, non_blocking=pin)
        return cls(host, layout)

    def to(self, device: torch.device) -> Tensor:
        """The tensor again, on ``device``."""
        local = self.host.to(device, non_blocking=True)
        if self.dtensor_layout is None:
            return local
        mesh, placements, shape, stride = self.dtensor_layout
        return DTensor.from_local(local, mesh, placements, run_check=False, shape=shape, stride=stride)


def offload_state(optimizer: torch.optim.Optimizer, device: torch.device) -> dict[Tensor, dict[str, HostCopy]]:
    """Move every state tensor of ``optimizer`` on ``device``'s type to host memory (pinned when CUDA is present);
    returns parameter -> its state tensors' host copies. Gradients in ``.grad`` are dropped first."""
    optimizer.zero_grad(set_to_none=True)  # (Megatron: views of DDP's buffers, which the caller frees)
    pin = device.type == "cuda"
    offloaded = {}
    for param, state in optimizer.state.items():
        on_device = [k for k, v in state.items() if isinstance(v, Tensor) and v.device.type == device.type]
        offloaded[param] = {k: HostCopy.of(state.pop(k), pin=pin) for k in on_device}
    return offloaded


def restore_state(optimizer: torch.optim.Optimizer, offloaded: dict[Tensor, dict[str, HostCopy]],
                  device: torch.device) -> None:
    """Put what :func:`offload_state` moved back into ``optimizer``'s state, on ``device``."""
    for param, copies in offloaded.items():
        optimizer.state[param].update({key: copy.to(device) for key, copy in copies.items()})
