"""The layers contract (setup.cfg's [importlinter] section, docs/architecture.md): rlkit's imports run one way.

The suite runs ``lint-imports`` on the package as it is, and on a copy with one upward import added inside a
function (a lazy import counts as much as a top-level one), which the contract must refuse."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = str(Path(sys.executable).with_name("lint-imports"))


def lint(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([LINT, "--config", str(ROOT / "setup.cfg"), "--no-cache"], cwd=folder,
                          capture_output=True, text=True, env={"PYTHONPATH": str(folder), "NO_COLOR": "1"})


def test_the_package_keeps_its_layers():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_upward_import_breaks_the_contract(tmp_path):
    shutil.copytree(ROOT / "rlkit", tmp_path / "rlkit", ignore=shutil.ignore_patterns("__pycache__"))
    prompts = tmp_path / "rlkit" / "data" / "prompts.py"
    prompts.write_text(prompts.read_text() + "\n\ndef _upward():\n    from rlkit.session import Session\n")
    result = lint(tmp_path)
    assert result.returncode != 0
    assert "rlkit.data.prompts -> rlkit.session" in result.stdout
