"""tinker-cookbook's RL recipe (``tinker_cookbook.recipes.math_rl.train``, ``env=arithmetic``) run unchanged against
rlkit's Tinker service: ``bench/tinker_cookbook_rl.py`` (``make tinker-cookbook-check``), whose reward must rise.

The cookbook lives in its own environment, ``bench/.venv-tinker`` (``scripts/setup-tinker-cookbook.sh``), never in
rlkit's lock, so the test is skipped where that is missing. Slow (1-3 minutes on 2 shared cores): a full-weight warm
start of the nano model on the recipe's rendered prompts, then 6 steps of the recipe. The script runs in its own
process (it starts Megatron sessions of its own).
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COOKBOOK_PYTHON = ROOT / "bench" / ".venv-tinker" / "bin" / "python"
STEPS = 6


@pytest.mark.slow
@pytest.mark.skipif(not COOKBOOK_PYTHON.exists(),
                    reason="tinker-cookbook's environment bench/.venv-tinker is missing: run scripts/setup-tinker-cookbook.sh")
def test_the_cookbook_rl_recipe_runs_unchanged_and_its_reward_rises():
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "tinker_cookbook_rl.py"), "--steps", str(STEPS)],
                         cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert run.returncode in (0, 1), run.stdout[-3000:] + run.stderr[-3000:]  # 1: ran, but the reward did not rise
    rewards = [float(m) for m in re.findall(r"^step \d+: reward ([-+.\d]+)", run.stdout, re.M)]
    assert len(rewards) == STEPS, run.stdout
    assert f"{STEPS} steps in s.history" in run.stdout  # every optim_step of the recipe was one step of the Session
    k = STEPS // 3
    assert sum(rewards[-k:]) / k > sum(rewards[:k]) / k + 0.02, rewards
