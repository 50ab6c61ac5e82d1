"""Run notebooks the way a user does: a real Jupyter kernel on this venv's Python, cells top to bottom.

The kernel spec is written to a temporary ``JUPYTER_PATH`` with ``sys.executable`` as its interpreter, so the
kernel is the test's own venv whatever kernels the machine has installed. Code cells tagged ``gpu`` are
replaced by a comment before execution (their output would need CUDA).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Iterable

import nbformat

REPO = Path(__file__).resolve().parents[2]
TUTORIALS = REPO / "tutorials"
KERNEL_NAME = "rlkit-test-venv"
SKIP_TAGS = ("gpu",)
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline",
               "TOKENIZERS_PARALLELISM": "false"}


def write_kernelspec(jupyter_path: Path) -> Path:
    """A kernel spec named ``KERNEL_NAME`` running this interpreter; returns its folder."""
    folder = jupyter_path / "kernels" / KERNEL_NAME
    folder.mkdir(parents=True, exist_ok=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "rlkit test venv",
        "language": "python",
        "env": OFFLINE_ENV,
        "metadata": {"debugger": False},
    }
    (folder / "kernel.json").write_text(json.dumps(spec, indent=1))
    return folder


def strip_tagged(nb: nbformat.NotebookNode, tags: Iterable[str] = SKIP_TAGS) -> list[int]:
    """Replace code cells carrying any of ``tags`` by a comment; returns their indices."""
    skipped = []
    for i, cell in enumerate(nb.cells):
        cell_tags = set(cell.get("metadata", {}).get("tags", []))
        if cell.cell_type == "code" and cell_tags & set(tags):
            cell.source = f"# skipped by the test runner (tagged {sorted(cell_tags & set(tags))})"
            skipped.append(i)
    return skipped


def execute(path: Path, workdir: Path, timeout: int = 600) -> tuple[nbformat.NotebookNode, float, list[int]]:
    """Execute the notebook at ``path`` with its working directory ``workdir``.

    Returns the executed notebook, the seconds it took and the indices of skipped cells. Raises nbclient's
    ``CellExecutionError`` (with the failing cell's traceback) if a cell fails.
    """
    from nbclient import NotebookClient

    nb = nbformat.read(str(path), as_version=4)
    skipped = strip_tagged(nb)
    client = NotebookClient(nb, timeout=timeout, kernel_name=KERNEL_NAME, allow_errors=False,
                            resources={"metadata": {"path": str(workdir)}})
    t0 = time.perf_counter()
    try:
        client.execute()
    finally:
        nbformat.write(nb, str(workdir / Path(path).name))  # the executed copy, for a look after a failure
    return nb, time.perf_counter() - t0, skipped


def outputs_stripped(nb: nbformat.NotebookNode) -> bool:
    return all(not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code")


def jupyter_path_env(jupyter_path: Path) -> dict[str, str]:
    return {"JUPYTER_PATH": os.pathsep.join([str(jupyter_path)] + [p for p in [os.environ.get("JUPYTER_PATH")] if p])}


def run_cells(cells: Iterable[str], workdir: Path, timeout: int = 180, allow_errors: bool = False) -> nbformat.NotebookNode:
    """Run code ``cells`` in a fresh kernel of this venv (kernelspec written under ``workdir``); the executed
    notebook, its outputs in ``nb.cells[i].outputs``."""
    from nbclient import NotebookClient

    write_kernelspec(workdir / "jupyter")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    saved = dict(os.environ)
    os.environ.update(jupyter_path_env(workdir / "jupyter"))
    try:
        NotebookClient(nb, timeout=timeout, kernel_name=KERNEL_NAME, allow_errors=allow_errors,
                       resources={"metadata": {"path": str(workdir)}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return nb
