"""Run every CPU benchmark in bench/ one after another (each prints its own side-by-side ratio)."""

import subprocess
import sys
from pathlib import Path

SCRIPTS = ["refit_vs_memcpy.py", "step_overhead.py"]

for name in SCRIPTS:
    print(f"== {name}", flush=True)
    subprocess.run([sys.executable, str(Path(__file__).parent / name)], check=True)
