"""The frozen base of an adapter run, out of memory while a colocated engine generates
(``policy.lora_cfg.release_base_while_generating``).

With adapters only the LoRA matrices train: the base weights are the model folder's, read once at build and never
changed. Between a refit and the policy's next forward pass nobody needs them, and on a machine whose engine holds
its own copy that is a second copy of the model resident for the whole rollout. :class:`FrozenBase` frees their
storage in place (the tensors, their views and any module holding them stay valid, as FSDP frees a gathered
parameter) and reads the folder again when they are needed: the same bytes through the same conversion as the first
load, so the weights come back exactly. The weights are kept in groups (a backend's decoder layers), each freed and
read back on its own, so a refit can read the base back one layer at a time while the engine loads its own copy.
"""

from __future__ import annotations

from typing import Callable, Hashable, Iterable, Mapping, Optional

import torch
from torch import Tensor


class FrozenBase:
    """The frozen parameters of one model, in groups, released (:meth:`release`) and read back (:meth:`restore`)."""

    def __init__(self, groups: Mapping[Hashable, Iterable[Tensor]], reload: Callable[[Optional[Hashable]], None]):
        """``groups``: key -> that group's frozen tensors (a storage shared by two groups belongs to the first);
        ``reload(key)``: copies the model folder's weights of group ``key`` (None: of every group) into them."""
        seen: set[int] = set()
        self._storages: dict[Hashable, list] = {}
        for key, params in groups.items():
            self._storages[key] = []
            for p in params:
                storage = p.untyped_storage()
                if storage.data_ptr() not in seen:
                    seen.add(storage.data_ptr())
                    self._storages[key].append((storage, storage.nbytes()))
        self._reload = reload
        self.released: set[Hashable] = set()

    def keys(self) -> list[Hashable]:
        return list(self._storages)

    def release(self, key: Optional[Hashable] = None) -> int:
        """Free group ``key``'s storage (None: every group's); returns the bytes freed."""
        keys = [k for k in (self._storages if key is None else [key]) if k not in self.released]
        for k in keys:
            for storage, _ in self._storages[k]:
                storage.resize_(0)
        self.released.update(keys)
        return sum(n for k in keys for _, n in self._storages[k])

    @torch.no_grad()
    def restore(self, key: Optional[Hashable] = None) -> None:
        """Reallocate group ``key``'s storage (None: every released group's) and read it back from the folder."""
        keys = [k for k in (self._storages if key is None else [key]) if k in self.released]
        for k in keys:
            for storage, nbytes in self._storages[k]:
                storage.resize_(nbytes)
        self.released.difference_update(keys)
        if keys and len(keys) == len(self._storages):
            self._reload(None)  # (one pass over the folder)
        else:
            for k in keys:
                self._reload(k)
