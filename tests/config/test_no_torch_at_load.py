"""config/ is schema and rules: none of its modules imports torch (or another heavy library) at load, and loading
a preset probes no machine; CUDA is asked by the checks whose answer depends on it, at validation
(``rlkit.config.checks.cuda_here``), and the machine's memory by the memory plan (``rlkit.memory.plan``).

Nor do the layers below config that it reads: the algorithm registries' names and knobs load apart from their
tensor code (``rlkit.algorithms.params``), the model checks read a preset's fields without transformers
(``rlkit.models.factory.preset_config``), and every module that ``rlkit.data``, ``rlkit.envs`` and ``rlkit.models``
load with the config imports torch in the functions that compute with it; ``rlkit.Trajectories`` loads on first
use. So loading a config imports no torch (the last test)."""

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = {"torch", "transformers", "megatron", "vllm", "psutil", "numpy", "datasets", "safetensors", "ray"}


def run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def test_no_config_module_imports_a_heavy_library_at_load():
    found = []
    for path in sorted((ROOT / "rlkit" / "config").glob("*.py")):
        for node in ast.parse(path.read_text()).body:  # module level only: imports inside functions run when called
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            found += [f"{path.name}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in HEAVY]
    assert not found


def test_loading_the_presets_probes_no_machine():
    out = run("""
import psutil, torch
from rlkit.config.loading import available_presets, load_config
from rlkit.errors import ConfigError

class Probed(BaseException):  # (not an Exception: validation would report it as a config problem)
    pass

def probe(*args, **kwargs):
    raise Probed("the machine was probed while a config loaded")

torch.cuda.is_available = torch.cuda.mem_get_info = torch.cuda.device_count = psutil.virtual_memory = probe
names, valid = available_presets(), 0
for name in names:
    try:
        valid += load_config(name) is not None
    except ConfigError:  # a preset for the user's own model (policy.model_name: ???), checked all the same
        pass
print(len(names), valid)
""")
    presets, valid = map(int, out.split())
    assert presets >= 5 and valid >= presets - 2  # every shipped preset validated, all but two whole


def test_loading_a_config_imports_no_torch():
    assert run("import sys; from rlkit.config.loading import load_config; load_config('quickstart'); "
               "print('torch' in sys.modules)") == "False"
