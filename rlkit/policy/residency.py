"""What a policy lets go of while a colocated engine generates, and takes back before it computes: the optimizer state
(offloaded to host memory from an accelerator), the gradient buffers (freed), and under adapters the frozen base
(freed and read back from the model folder, :mod:`rlkit.policy.frozen_base`). A mixin of
:class:`rlkit.policy.in_process.InProcessPolicy`, which supplies ``optimizer``, ``device``, ``cfg`` and the
backend hooks ``_release_gradient_buffers`` / ``_reallocate_gradient_buffers``."""

from __future__ import annotations

import contextlib
from typing import Optional

import torch
from torch import Tensor

from rlkit.errors import defer_keyboard_interrupt
from rlkit.policy.optimizer import HostCopy, offload_state, restore_state


class MemoryResidency:
    # while the optimizer state is offloaded (:meth:`offload_optimizer_state`): parameter -> its state tensors'
    # host copies (empty after a reset_optimizer: nothing to bring back but the gradient buffers); None otherwise
    _offloaded_state: Optional[dict[Tensor, dict[str, HostCopy]]] = None
    # under adapters, the frozen base while it can be released (policy.lora_cfg.release_base_while_generating)
    _frozen_base = None  # a rlkit.policy.frozen_base.FrozenBase

    # ---- the frozen base, released while an engine generates (policy.lora_cfg) -----------------------
    @property
    def releases_base_while_generating(self) -> bool:
        return self.cfg.lora_cfg.releases_base

    def release_frozen_base(self) -> int:
        """Free the frozen base weights (adapters only train) until the next forward pass, export or HF import
        reads them back from the model folder, exactly (:mod:`rlkit.policy.frozen_base`); returns the bytes freed.
        A backend that can read its base back from the folder supplies it (Megatron)."""
        raise NotImplementedError(f"{type(self).__name__} cannot release its frozen base; "
                                  "policy.lora_cfg.release_base_while_generating is built for the megatron backend")

    def _frozen_base_in(self) -> None:
        """Read a released frozen base back (nothing otherwise); every use of the base weights calls this first."""
        if self._frozen_base is not None:
            self._frozen_base.restore()

    # ---- optimizer state offload (colocated generation) --------------------------------------------
    def _offload_frees_memory(self) -> bool:
        """Whether the weights, and so the optimizer state and gradient buffers, live in accelerator memory:
        only then does an offload free anything (on a CPU machine it would copy host memory to host memory)."""
        return self.device.type != "cpu"

    @torch.no_grad()
    def offload_optimizer_state(self) -> None:
        """Move every optimizer state tensor on the weights' device (AdamW's fp32 ``exp_avg`` and ``exp_avg_sq``,
        2x the parameters) to host memory, pinned when CUDA is present, and free the gradient buffers (Megatron's
        DDP ``main_grad`` buffers, fp32, 1x the parameters; their contents are not needed between steps), so a
        colocated generator has that memory while it generates. Gradients left in ``.grad`` by
        :meth:`compute_gradients` are dropped. Brought back by :meth:`restore_optimizer_state`, which
        :meth:`train_step` and :meth:`compute_gradients` call first; :meth:`save_state` and :meth:`load_state`
        bring it back for their call and offload it again after. Nothing happens when the weights live on the
        CPU already, or when the state is offloaded already."""
        if self._offloaded_state is not None or not self._offload_frees_memory():
            return
        with defer_keyboard_interrupt():  # a state half moved would be half lost
            self._offloaded_state = offload_state(self.optimizer, self.device)
            self._release_gradient_buffers()
        if self.device.type == "cuda":  # the copies are asynchronous; cached blocks go back to the driver
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def release_gradient_buffers(self) -> None:
        """Free the gradient buffers between steps (the next step zeroes them anyway): on the CPU, where the optimizer
        state has nowhere to go, the part of the training state a colocated engine can have while it generates;
        reallocated by the next step (:meth:`restore_optimizer_state`). Nothing happens once released or offloaded."""
        if self._offloaded_state is None:
            self._release_gradient_buffers()
            self._offloaded_state = {}  # (nothing moved: the gradient buffers alone come back)

    @torch.no_grad()
    def restore_optimizer_state(self) -> None:
        """Bring back what :meth:`offload_optimizer_state` moved: the state tensors onto the weights' device, the
        gradient buffers reallocated (zeroed). Nothing happens when nothing is offloaded."""
        if self._offloaded_state is None:
            return
        with defer_keyboard_interrupt():
            restore_state(self.optimizer, self._offloaded_state, self.device)
            self._reallocate_gradient_buffers()
            self._offloaded_state = None

    @contextlib.contextmanager
    def _optimizer_state_in_place(self):
        """The optimizer state where the optimizer keeps it for the block, let go of again after as it was before:
        offloaded, or (on the CPU) only the gradient buffers released."""
        before = self._offloaded_state
        self.restore_optimizer_state()
        try:
            yield
        finally:
            if before:
                self.offload_optimizer_state()
            elif before is not None:
                self.release_gradient_buffers()
