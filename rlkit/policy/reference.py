"""The frozen KL reference of a policy, resident only while something uses it.

Why: a copy of the weights is a model's worth of memory (2.4 GB at 0.6B parameters in fp32), and most runs
never read it (no KL penalty, no KL in the reward). The builder tells the policy whether its session needs a
reference (:meth:`Reference.keep`, through the policy's ``keep_reference``, with the session's one rule,
``Session.needs_reference``); until told, the policy holds it on first use.

Where the reference comes from when it is not held: the model folder while it is still the folder's weights
(loaded on first use, e.g. after ``configure()`` turns on a KL penalty), or the live weights when nothing
changed them since the reference was set. A reference frozen while nobody needed it (``set_reference_to_current``
after an SFT warm start with no KL penalty), whose weights then changed, is gone: using it raises
:class:`ReferenceUnavailableError` with what to do.

Scoring with the reference swaps its tensors into the model's parameters in place, chunk by chunk through one
small buffer, and back after: no second model, no clone of the live weights (:func:`swap_contents`). A bf16
compute copy (Megatron's :class:`rlkit.policy.precision.Bf16Twin`) is a function of the fp32 masters, so the
reference is copied into it and the masters pulled back after, with no swap at all.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

from rlkit.errors import RLKitError

SWAP_CHUNK = 1 << 22  # elements per copy through the swap buffer (16 MB in fp32)


class ReferenceUnavailableError(RLKitError, RuntimeError):
    """The KL reference was not kept (nothing needed it) and cannot be rebuilt."""


def _local(t: Tensor) -> Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


@torch.no_grad()
def swap_contents(a: Tensor, b: Tensor, buffer: Optional[Tensor] = None) -> None:
    """Exchange the values of ``a`` and ``b`` (same shape and dtype; a DTensor's local shard) in place, through
    ``buffer`` (1-D, at least one element; default: one chunk): no copy of a whole tensor is ever made."""
    x, y = _local(a), _local(b)
    if not (x.is_contiguous() and y.is_contiguous()):  # (parameters and their clones are contiguous)
        tmp = x.clone()
        x.copy_(y)
        y.copy_(tmp)
        return
    x, y = x.view(-1), y.view(-1)
    if buffer is None or buffer.dtype != x.dtype or buffer.device != x.device:
        buffer = torch.empty(min(SWAP_CHUNK, x.numel()), dtype=x.dtype, device=x.device)
    step = buffer.numel()
    for i in range(0, x.numel(), step):
        j = min(i + step, x.numel())
        tmp = buffer[: j - i]
        tmp.copy_(x[i:j])
        x[i:j].copy_(y[i:j])
        y[i:j].copy_(tmp)


def swap_all(params: dict[str, Tensor], tensors: dict[str, Tensor]) -> None:
    """:func:`swap_contents` for every parameter with its tensor of the same name (one buffer per dtype)."""
    buffers: dict[tuple, Tensor] = {}
    for name, param in params.items():
        local = _local(param)
        key = (local.dtype, local.device)
        if key not in buffers:
            size = min(SWAP_CHUNK, max(_local(p).numel() for p in params.values()))
            buffers[key] = torch.empty(max(size, 1), dtype=local.dtype, device=local.device)
        swap_contents(param, tensors[name], buffers[key])


class Reference:
    """The KL reference of a training loop's ``adapter`` (:class:`rlkit.policy.adapter.ModelAdapter`): ``tensors``
    (parameter name -> this rank's shard) when held; else loadable from ``folder`` (the model folder whose weights
    it is), or equal to the live weights while ``is_current``. Under adapters (``policy.lora_cfg``) it is the base
    model with the adapters switched off: no copy (``needs_copy`` is False), no swap, and freezing keeps the base
    (after an SFT warm start with adapters the KL is measured against the model folder's weights)."""

    def __init__(self, adapter):
        self.adapter = adapter
        self.tensors: Optional[dict[str, Tensor]] = None
        self.folder: Optional[str] = adapter.cfg.model_name  # the weights just loaded are the reference
        self.is_current = True  # nothing changed the policy's weights since they became the reference
        self.wanted: Optional[bool] = None  # told by keep; None: held from first use on

    needs_copy = property(lambda self: not self.adapter.cfg.lora_cfg.enabled)

    def keep(self, needed: bool) -> None:
        """Whether the reference is used (the session's ``needs_reference`` rule). Needed: held from now on (from
        the live weights or the model folder). Not needed: none held, unless dropping it would lose it (a
        reference frozen after training that cannot be rebuilt)."""
        self.wanted = needed
        if needed and self.needs_copy:
            self.hold()
        elif not needed and (self.is_current or self.folder is not None):  # (rebuildable on demand: nothing lost)
            self.tensors = None

    def freeze_current(self) -> None:
        """The live weights become the reference: copied now unless it is known to be unused (:meth:`keep`)."""
        self.tensors, self.folder, self.is_current = None, None, True
        if self.wanted is not False and self.needs_copy:
            self.hold()

    def restore(self, folder: Optional[str], tensors: Optional[dict[str, Tensor]]) -> None:
        """A checkpoint's reference: its ``tensors`` when it held them, else the model ``folder`` it reloads from."""
        self.tensors, self.folder, self.is_current = tensors, folder, False

    def hold(self) -> None:
        """Make the reference resident: a copy of the live weights while they are still the reference, else the
        model folder's weights (loaded into the model, then swapped out: the live weights come back unchanged)."""
        if self.tensors is not None:
            return
        params = dict(self.adapter.model.named_parameters())
        if self.is_current:
            self.tensors = {n: p.detach().clone() for n, p in params.items()}
            return
        if self.folder is None:
            raise ReferenceUnavailableError(
                "the KL reference was not kept: it was frozen (set_reference_to_current) while no reference was "
                "needed, and the weights have changed since. Freeze the current weights with "
                "policy.set_reference_to_current(), or start over from the model folder with session.reset() (it "
                "keeps a reference when the loss needs one)")
        from rlkit.policy.architecture import load_hf_state

        with torch.no_grad():
            held = {n: p.detach().clone() for n, p in params.items()}  # becomes the reference after the swap
            self.adapter.copy_hf_state(load_hf_state(self.folder))
            swap_all(params, held)
        self.tensors = held
        if self.adapter.twin is not None:  # the live masters are back: refresh the bf16 copy
            self.adapter.twin.pull()

    @contextlib.contextmanager
    def weights_in(self):
        """The model computes with the reference weights inside the block; the live weights come back after, even
        if the block raises. The held reference is swapped into the parameters in place (no clone); a bf16 compute
        copy gets the reference and is pulled back from the fp32 masters after."""
        if not self.needs_copy:  # the base model with the adapters off
            with self.adapter.adapters_disabled():
                yield
            return
        self.hold()
        twin = self.adapter.twin
        if twin is not None:
            with torch.no_grad():
                for name, param in twin.compute.named_parameters():
                    param.copy_(self.tensors[name])
            try:
                yield
            finally:
                twin.pull()
            return
        params = dict(self.adapter.model.named_parameters())
        swap_all(params, self.tensors)
        try:
            yield
        finally:
            swap_all(params, self.tensors)

    def residency(self) -> str:
        """What the reference costs in memory now, and why, in words (the session card reads it: no engine call)."""
        if not self.needs_copy:
            return "no copy: the base weights with the adapters off"
        if self.tensors is not None:
            why = "the loss uses it" if self.wanted else "used"
            held = sum(_local(t).numel() * t.element_size() for t in self.tensors.values())
            return f"resident, {held / 2**20:.1f} MiB on this rank ({why})"
        source = ("loaded from the model folder if needed" if self.folder else
                  "the live weights until they change" if self.is_current else "not kept")
        return f"not resident (no KL penalty; {source})"
