"""Run every CPU benchmark in bench/ one after another (each prints its own side-by-side ratio).

bench/gpu_check.py is for a GPU machine and is not run here (its tiny CPU smoke run is in the test suite).
"""

import subprocess
import sys
from pathlib import Path

SCRIPTS = ["startup.py", "refit_vs_floor.py", "step_overhead.py", "broadcast_refit.py", "async_vs_sync.py",
           "megatron_vs_dtensor.py", "parallel_layouts.py", "same_work.py", "rollout_vs_vllm.py"]

for name in SCRIPTS:
    print(f"== {name}", flush=True)
    subprocess.run([sys.executable, str(Path(__file__).parent / name)], check=True)
