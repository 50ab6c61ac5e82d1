"""The model folder on every node of a Ray cluster: seen at the same path, or shipped once, or a clear error.

The driver resolves ``policy.model_name`` (a relative path against the driver's working directory: each
node's Ray may have been started from another one) and fingerprints the folder (file names and sizes, and
the bytes of its small files: config, tokenizer). Every rank then checks the folder at that path on its own
node. Where a node does not see it, or sees a different folder there:

* a folder of at most ``policy.ray_cfg.ship_model_max_mb`` is shipped: the driver puts its files into Ray's
  object store once, and one rank per lacking node writes them into a node-local cache,
  ``<the node's temp dir>/rlkit-models/<fingerprint>`` (``TMPDIR`` of that node's Ray), which later groups
  reuse; that node's ranks load from there;
* a larger one (or any, with the limit 0) is a :class:`rlkit.errors.ModelError` naming the rank, the node and
  the path: put the folder on a file system every node mounts at the same path.

Deliberate simplifications: the fingerprint does not read the weight files' bytes (a same-sized file with other
weights passes the check); the whole folder travels as one object (fine up to the object store's size).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from rlkit.errors import ModelError

SMALL_FILE_BYTES = 1 << 20  # files up to this size enter the fingerprint with their content


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def folder_fingerprint(folder: str | Path) -> str:
    """A short hash of ``folder``: its files' relative names and sizes, and the content of the small ones."""
    folder = Path(folder)
    h = hashlib.sha256()
    for path in _files(folder):
        size = path.stat().st_size
        h.update(f"{path.relative_to(folder)}\0{size}\0".encode())
        if size <= SMALL_FILE_BYTES:
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def folder_files(folder: str | Path) -> dict[str, bytes]:
    """Every file of ``folder`` by relative name (what the object store carries to the nodes)."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): p.read_bytes() for p in _files(folder)}


def folder_problem(path: str, fingerprint: str) -> Optional[str]:
    """On a node: None when it sees the driver's folder at ``path``, else what it sees instead."""
    folder = Path(path)
    if not (folder / "config.json").is_file():
        return "no model folder (no config.json)"
    if folder_fingerprint(folder) != fingerprint:
        return "a different folder (other files or sizes)"
    return None


def node_cache_folder(fingerprint: str) -> Path:
    """Where this node keeps shipped model folders: under its temp dir, one folder per fingerprint."""
    return Path(tempfile.gettempdir()) / "rlkit-models" / fingerprint


def write_cached_folder(files: dict[str, bytes], fingerprint: str) -> str:
    """On a node: the shipped folder written once into :func:`node_cache_folder` (atomically: a folder is
    renamed into place only when complete); its path."""
    target = node_cache_folder(fingerprint)
    if folder_problem(str(target), fingerprint) is None:
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{fingerprint}-", dir=target.parent))
    for name, data in files.items():
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        (staging / name).write_bytes(data)
    try:
        os.rename(staging, target)
    except OSError:  # another process finished first (or a broken leftover is in the way)
        shutil.rmtree(staging, ignore_errors=True)
        if folder_problem(str(target), fingerprint) is not None:
            shutil.rmtree(target, ignore_errors=True)
            return write_cached_folder(files, fingerprint)
    return str(target)


def model_folder_on_ranks(folder: Path, workers: Sequence[Any], nodes: Sequence[str], ship_max_mb: float,
                          gather: Callable[[list, str], list]) -> list[str]:
    """The model path each rank loads from (``nodes``: each rank's node, in words), after checking every
    node and shipping the folder to the nodes that lack it (see the module docstring). ``workers`` are the
    rank actors, with ``folder_problem`` and ``write_cached_folder`` methods; ``gather(refs, what)`` waits
    for their results."""
    import ray

    fingerprint = folder_fingerprint(folder)
    problems = gather([w.folder_problem.remote(str(folder), fingerprint) for w in workers], "model folder check")
    paths = [str(folder)] * len(workers)
    lacking = [r for r, p in enumerate(problems) if p is not None]
    if not lacking:
        return paths
    size_mb = sum(p.stat().st_size for p in _files(Path(folder))) / 1e6
    if size_mb > ship_max_mb:
        lines = "; ".join(f"rank {r} on {nodes[r]} sees {problems[r]} at {folder}" for r in lacking)
        raise ModelError(f"the model folder {folder} is not on every node: {lines}. Put it on a file system every "
                         f"node mounts at the same path, or let rlkit copy it to the nodes that lack it (it is "
                         f"{size_mb:.1f} MB; policy.ray_cfg.ship_model_max_mb={ship_max_mb:g})")
    files = ray.put(folder_files(folder))
    writer = {}  # one rank per lacking node writes the copy
    for r in lacking:
        writer.setdefault(nodes[r], r)
    written = gather([workers[r].write_cached_folder.remote(files, fingerprint) for r in writer.values()],
                     "model folder copy")
    copy_on = dict(zip(writer, written))
    for r in lacking:
        paths[r] = copy_on[nodes[r]]
    return paths
