"""What a policy lets go of while a colocated engine generates, and takes back before it computes: the optimizer state
(offloaded to host memory from an accelerator), the gradient buffers (freed), and under adapters the frozen base
(freed and read back from the model folder, :mod:`rlkit.policy.frozen_base`). Held by the training loop
(:class:`rlkit.policy.in_process.InProcessPolicy`), which hands it the optimizer; the model adapter frees and
reallocates the gradient buffers and holds the frozen base."""

from __future__ import annotations

import contextlib
from typing import Optional

import torch
from torch import Tensor

from rlkit.errors import defer_keyboard_interrupt
from rlkit.policy.optimizer import HostCopy, offload_state, restore_state


class Residency:
    def __init__(self, adapter):
        self.adapter = adapter
        # while the optimizer state is offloaded (:meth:`offload`): parameter -> its state tensors' host copies
        # (empty after a reset_optimizer, or when only the gradient buffers were released); None otherwise
        self.offloaded: Optional[dict[Tensor, dict[str, HostCopy]]] = None

    def base_in(self) -> None:
        """Read a released frozen base back (nothing otherwise); every use of the base weights calls this first."""
        if self.adapter.frozen_base is not None:
            self.adapter.frozen_base.restore()

    def frees_memory(self) -> bool:
        """Whether the weights, and so the optimizer state and gradient buffers, live in accelerator memory:
        only then does an offload free anything (on a CPU machine it would copy host memory to host memory)."""
        return self.adapter.device.type != "cpu"

    @torch.no_grad()
    def offload(self, optimizer: torch.optim.Optimizer) -> None:
        """Move every state tensor of ``optimizer`` on the weights' device (AdamW's ``exp_avg`` and ``exp_avg_sq``,
        2x the parameters) to host memory, pinned under CUDA, and free the gradient buffers (Megatron's DDP
        ``main_grad``, 1x the parameters; ``.grad`` is dropped) until :meth:`restore`. Nothing happens when the
        weights live on the CPU already, or when the state is offloaded already."""
        if self.offloaded is not None or not self.frees_memory():
            return
        with defer_keyboard_interrupt():  # a state half moved would be half lost
            self.offloaded = offload_state(optimizer, self.adapter.device)
            self.adapter.release_gradient_buffers()
        if self.adapter.device.type == "cuda":  # the copies are asynchronous; cached blocks go back to the driver
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def release_gradient_buffers(self) -> None:
        """Free the gradient buffers between steps (the next step zeroes them anyway): on the CPU, where the optimizer
        state has nowhere to go, the part of the training state a colocated engine can have while it generates;
        reallocated by the next step (:meth:`restore`). Nothing happens once released or offloaded."""
        if self.offloaded is None:
            self.adapter.release_gradient_buffers()
            self.offloaded = {}  # (nothing moved: the gradient buffers alone come back)

    @torch.no_grad()
    def restore(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring back what :meth:`offload` moved: the state tensors onto the weights' device, the gradient buffers
        reallocated (zeroed). Nothing happens when nothing is offloaded."""
        if self.offloaded is None:
            return
        with defer_keyboard_interrupt():
            restore_state(optimizer, self.offloaded, self.adapter.device)
            self.adapter.reallocate_gradient_buffers()
            self.offloaded = None

    @contextlib.contextmanager
    def in_place(self, optimizer: torch.optim.Optimizer):
        """The optimizer state where the optimizer keeps it for the block, let go of again after as it was before:
        offloaded, or (on the CPU) only the gradient buffers released."""
        before = self.offloaded
        self.restore(optimizer)
        try:
            yield
        finally:
            if before:
                self.offload(optimizer)
            elif before is not None:
                self.release_gradient_buffers()
