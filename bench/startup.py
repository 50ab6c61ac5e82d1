"""Session start-up of the fast notebook preset (quickstart_nano), each start in a fresh Python process.

A notebook user pays this once per kernel, so it is measured the way they meet it: a new process that imports
rlkit and builds ``Session.from_config("quickstart_nano")``. Three starts: the first in an empty folder (the
model folder is made), a second with the folder there, and ``Session.load`` of a checkpoint saved after one
step. Each prints its breakdown (``session.startup``: config, model folder, tokenizer, data, environment, policy build,
generator start) plus the import of rlkit's session and the first refit, and how many known third-party
notices the quiet start held back. Last line (bench/run_all.py): ``cold_start_s`` (the first start, the model
folder made), ``warm_start_s`` (a second start: the folder there, the OS's file cache warm), ``load_start_s`` and
each start's parts as ``cold_<part>_s`` / ``warm_<part>_s``.
Usage: python bench/startup.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PRESET = "quickstart_nano"
PARTS = ("import", "config", "model folder", "tokenizer", "data", "environment", "policy", "generator", "first refit")
# the rest of the wall time: the loss and rollout source; for a load, reading the checkpoint's config and state


def child(folder: str, mode: str) -> None:
    """One start in this process; prints one JSON line: seconds per part, notices held back, wall time."""
    import os

    os.chdir(folder)
    t0 = time.perf_counter()
    from rlkit.session import Session

    imported = time.perf_counter() - t0
    session = Session.load("checkpoint") if mode == "load" else Session.from_config(PRESET)
    seconds = {"import": imported, **session.startup.seconds}
    t1 = time.perf_counter()
    session.refit()
    seconds["first refit"] = time.perf_counter() - t1
    wall = time.perf_counter() - t0
    if mode == "first":
        session.step()
        session.save("checkpoint")
    print(json.dumps({"seconds": seconds, "held_back": session.startup.held_back, "wall": wall}), flush=True)


def run(folder: str, mode: str) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", folder, mode], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        runs = {"first start (model made)": run(folder, "first"), "second start": run(folder, "second"),
                "Session.load": run(folder, "load")}
    print(f"Session start-up of {PRESET!r}, each in a fresh process (seconds)")
    width = {p: max(len(p), 5) + 2 for p in PARTS}
    print(f"{'':<26}" + "".join(f"{p:>{width[p]}}" for p in PARTS) + f"{'rest':>7}{'wall':>7}{'held back':>11}")
    for name, r in runs.items():
        cells = "".join(f"{r['seconds'].get(p, 0.0):>{width[p]}.2f}" for p in PARTS)
        rest = r["wall"] - sum(r["seconds"].get(p, 0.0) for p in PARTS)
        print(f"{name:<26}{cells}{rest:>7.2f}{r['wall']:>7.2f}{r['held_back']:>11}")
    print("held back: known third-party notices not shown (rlkit.quiet); Session(..., verbose=True) shows them")
    figures = {}
    for key, r in zip(("cold", "warm", "load"), runs.values()):
        figures[f"{key}_start_s"] = r["wall"]
        if key != "load":
            figures.update({f"{key}_{p.replace(' ', '_')}_s": r["seconds"].get(p, 0.0) for p in PARTS})
    print(" ".join(f"{k}={v:.2f}" for k, v in figures.items()))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
    else:
        main()
