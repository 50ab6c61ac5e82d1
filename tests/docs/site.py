"""Build the docs site the way ``make docs`` does: ``.venv``'s MkDocs with ``--strict``, offline."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS_PACKAGES = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python", "mkdocs_jupyter")


def missing_docs_packages() -> list[str]:
    out = []
    for name in DOCS_PACKAGES:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            out.append(name)
    return out


def build_site(site_dir: Path, timeout: int = 600) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", HF_HUB_OFFLINE="1")
    t0 = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    return result, time.perf_counter() - t0
