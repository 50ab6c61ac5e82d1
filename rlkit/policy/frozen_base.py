"""The frozen base of an adapter run, out of memory while a colocated engine generates
(``policy.lora_cfg.release_base_while_generating``).

With adapters only the LoRA matrices train: the base weights are the model folder's, read once at build and never
changed. Between a refit (the last read of the merged weights) and the policy's next forward pass nobody needs
them, and on a machine whose engine holds its own copy that is a second copy of the model resident for the whole
rollout. :class:`FrozenBase` frees their storage in place (the tensors, their views and any module holding them
stay valid, as FSDP frees a gathered parameter) and, before the next use, reallocates it and reads the folder
again: the same bytes through the same conversion as the first load, so the weights come back exactly.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import Tensor


class FrozenBase:
    """The frozen parameters of one model, released (:meth:`release`) and read back (:meth:`restore`)."""

    def __init__(self, params: Iterable[Tensor], reload: Callable[[], None]):
        """``params``: the frozen tensors (under adapters, every base weight); ``reload``: copies the model folder's
        weights into them (the backend's own loader, strict on names and shapes)."""
        storages = {}
        for p in params:
            storage = p.untyped_storage()
            storages.setdefault(storage.data_ptr(), (storage, storage.nbytes()))
        self._storages = list(storages.values())
        self._reload = reload
        self.released = False

    @property
    def nbytes(self) -> int:
        return sum(n for _, n in self._storages)

    def release(self) -> int:
        """Free every frozen tensor's storage; returns the bytes freed (0 if already released)."""
        if self.released:
            return 0
        for storage, _ in self._storages:
            storage.resize_(0)
        self.released = True
        return self.nbytes

    @torch.no_grad()
    def restore(self) -> None:
        """Reallocate the storage and read the weights back from the folder (nothing if not released)."""
        if not self.released:
            return
        for storage, nbytes in self._storages:
            storage.resize_(nbytes)
        self.released = False
        self._reload()
