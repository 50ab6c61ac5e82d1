"""The bench scripts' tests: each loads its script from bench/ as a module (:func:`bench_script`)."""

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def bench_script(name: str):
    """``bench/<name>.py`` loaded as a module (the scripts are not a package: run from a checkout)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
