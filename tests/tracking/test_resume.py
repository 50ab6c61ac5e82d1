"""``rlkit train`` killed with SIGKILL mid-run and resumed with ``--resume`` logs the same metrics as an
uninterrupted run, with the policy in this process and as a 2-rank Ray worker group (each rank writes its
shard of the checkpoint).

Three processes run the same config (SFT warm start, then 6 GRPO steps, a checkpoint every 2 steps):
A uninterrupted; B killed as soon as its step-2 checkpoint exists; C = ``rlkit train ... --resume`` in B's
folder. Every process gets OMP_NUM_THREADS=1 so all three do identical float work (thread count changes
reduction order). Tolerance: rel 1e-6 / abs 1e-7 per metric (observed: bit-identical).
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from rlkit.config.loading import config_to_yaml
from tests.tracking.conftest import deterministic, tiny_config

pytestmark = pytest.mark.slow


def train(config_path, log_dir, *extra):
    """``rlkit train`` in a subprocess; its output goes to ``<log_dir>.log`` (a pipe could fill and block it)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    log = open(f"{log_dir}{'-resume' if extra else ''}.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "rlkit.cli", "train", str(config_path), f"logger.log_dir={log_dir}",
                             "--quiet", *extra], env=env, stdout=log, stderr=subprocess.STDOUT)
    proc.log_path = log.name
    log.close()
    return proc


def tail(proc):
    with open(proc.log_path) as f:
        return f.read()[-3000:]


def metric_lines(path):
    return [deterministic(json.loads(line)) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("num_workers", [1, 2])
def test_sigkill_then_resume_matches_uninterrupted_run(warm_model, tmp_path, num_workers):
    cfg = tiny_config(warm_model, tmp_path, "name=run", "grpo.max_num_steps=6", "sft.enabled=true", "sft.num_steps=10",
                      "sft.lr=1e-3", "loss_fn.reference_policy_kl_penalty=0.05", "checkpointing.enabled=true",
                      "checkpointing.save_period=2", "checkpointing.keep_last=2", f"policy.num_workers={num_workers}")
    config_path = tmp_path / "run.yaml"
    config_path.write_text(config_to_yaml(cfg))
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a, b = train(config_path, a_dir), train(config_path, b_dir)
    try:
        deadline = time.monotonic() + 600
        while not (b_dir / "run" / "checkpoints" / "step_000002").is_dir():
            assert b.poll() is None, f"B ended before its first RL checkpoint:\n{tail(b)}"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        b.send_signal(signal.SIGKILL)
        assert b.wait(timeout=60) == -signal.SIGKILL
        assert a.wait(timeout=600) == 0, tail(a)
    finally:
        a.kill()
        b.kill()
    assert not (b_dir / "run" / "summary.json").exists()
    killed_at = sorted(p.name for p in (b_dir / "run" / "checkpoints").iterdir() if p.name.startswith("step_"))
    assert killed_at[-1] in ("step_000002", "step_000004")  # mid-run: the run has 6 steps

    c = train(config_path, b_dir, "--resume")
    assert c.wait(timeout=600) == 0, tail(c)

    summary_a = json.loads((a_dir / "run" / "summary.json").read_text())
    summary_b = json.loads((b_dir / "run" / "summary.json").read_text())
    assert summary_a["resumed_from_step"] is None and summary_b["resumed_from_step"] == int(killed_at[-1][5:])
    for key in ("accuracy_before_rl", "accuracy_after_rl", "sft_final_loss", "reward_first_10_steps", "rl_steps"):
        assert summary_b[key] == pytest.approx(summary_a[key], rel=1e-6), key

    lines_a = metric_lines(a_dir / "run" / "metrics.jsonl")
    lines_b = metric_lines(b_dir / "run" / "metrics.jsonl")
    assert [line["step"] for line in lines_b] == [line["step"] for line in lines_a] == [0, 1, 2, 3, 4, 5, 6, 6]
    assert any(line.get("train/grad_norm", 0) > 0 for line in lines_a[3:])  # learning after the resume point
    for got, want in zip(lines_b, lines_a):
        assert got == pytest.approx(want, rel=1e-6, abs=1e-7)
    assert sorted(p.name for p in (b_dir / "run" / "checkpoints").iterdir()) == ["step_000004", "step_000006"]
