"""The GPU benchmark's code path on the CPU (tiny model, fp32): both backends take a step and the report
prints their times and the ratio. Timings are not asserted (benchmarks report speed, tests check code)."""

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu_1b_step.py"


def test_gpu_bench_runs_both_backends_on_a_tiny_model(capsys):
    spec = importlib.util.spec_from_file_location("gpu_1b_step", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.main(["--hidden", "128", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--ffn", "384",
                "--vocab", "128", "--batch", "2", "--seq", "64", "--micro-batch", "1", "--steps", "1",
                "--warmup", "0", "--dtype", "float32"])
    out = capsys.readouterr().out
    assert "FAILED" not in out, out
    assert "megatron  step: median" in out and "dtensor   step: median" in out
    assert "ratio Megatron / DTensor:" in out
