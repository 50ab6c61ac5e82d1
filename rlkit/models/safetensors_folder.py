"""An HF model folder's weights read lazily and written back in the folder's own shard layout.

Why: a real checkpoint is several GB in several shards (``model.safetensors.index.json`` names the file of
each tensor). Reading it into one dict, converting, then copying into the model holds the weights two or
three times over. :class:`SafetensorsFolder` is a read-only mapping that reads a tensor from its shard only
when asked (the safetensors header gives names, shapes and dtypes without reading data), so a policy can
load one layer at a time; :func:`write_like` writes exported groups into the same files the source folder
used, one shard in memory at most.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from rlkit.models.folder import INDEX_FILE

_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
           "I64": torch.int64, "I32": torch.int32, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


class SafetensorsFolder(Mapping[str, Tensor]):
    """HF tensor name -> tensor, read from the folder's ``*.safetensors`` files on access (a fresh tensor each
    time: keep what you need). ``meta()`` gives the same names as meta tensors, for checking names and shapes
    without reading any data."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self._file_of: dict[str, Path] = {}
        self._meta: dict[str, Tensor] = {}
        for file in sorted(self.folder.glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    piece = f.get_slice(name)
                    self._file_of[name] = file
                    self._meta[name] = torch.empty(piece.get_shape(), dtype=_DTYPES[piece.get_dtype()], device="meta")

    def __getitem__(self, name: str) -> Tensor:
        with safe_open(str(self._file_of[name]), framework="pt") as f:
            return f.get_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._file_of)

    def __len__(self) -> int:
        return len(self._file_of)

    def meta(self) -> dict[str, Tensor]:
        return dict(self._meta)

    def file_of(self) -> dict[str, str]:
        """Tensor name -> the file (name only) that holds it."""
        return {name: file.name for name, file in self._file_of.items()}


def as_meta(hf: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``hf`` as meta tensors of the same shapes and dtypes (no data read or copied)."""
    if isinstance(hf, SafetensorsFolder):
        return hf.meta()
    return {name: torch.empty(t.shape, dtype=t.dtype, device="meta") for name, t in hf.items()}


def write_like(groups: Iterable[list[tuple[str, Tensor]]], source: str | Path, output: str | Path) -> list[str]:
    """Write the HF-named tensors of ``groups`` into ``output`` in the shard layout of the ``source`` folder
    (the same file for each tensor, its index copied when there is one). A file is written as soon as all its
    tensors have arrived. The names must be exactly the source's. Returns the files written."""
    layout = SafetensorsFolder(source).file_of()
    waiting: dict[str, set[str]] = {}
    for name, file in layout.items():
        waiting.setdefault(file, set()).add(name)
    pending: dict[str, dict[str, Tensor]] = {}
    written = []
    for group in groups:
        for name, tensor in group:
            if name not in layout:
                raise ValueError(f"exported tensor {name!r} is not in {str(source)!r}; the export names the source's "
                                 "tensors only")
            file = layout[name]
            pending.setdefault(file, {})[name] = tensor.detach().contiguous().clone()
            waiting[file].discard(name)
            if not waiting[file]:
                save_file(pending.pop(file), str(Path(output) / file), metadata={"format": "pt"})
                written.append(file)
    missing = sorted(n for names in waiting.values() for n in names)
    if missing:
        raise ValueError(f"the export lacks tensors of {str(source)!r}: {missing[:5]}")
    index = Path(source) / INDEX_FILE
    if index.is_file():
        (Path(output) / INDEX_FILE).write_text(index.read_text())
    return written
