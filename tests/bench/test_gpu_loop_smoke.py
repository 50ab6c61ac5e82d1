"""bench/gpu_loop.py's code path on the CPU at a tiny size: the stages one call at a time with the Megatron
generator on the policy's own weights and with transformers' generator, one JSON and the table. Timings are not
asserted (benchmarks report speed, tests check code); the mismatch is (the same weights sample and score), and the
GPU defaults are checked to be the ~0.6B model the issue asks for."""

import json

import pytest

from tests.bench import bench_script


@pytest.fixture(scope="module")
def bench():
    return bench_script("gpu_loop")


def test_gpu_loop_runs_the_stages_with_both_generators_on_a_tiny_model(bench, tmp_path, capsys):
    out = tmp_path / "gpu_loop.json"
    bench.main(["--device", "cpu", "--steps", "2", "--out", str(out)])
    result = json.loads(out.read_text())
    assert [r["generator"] for r in result["runs"]] == ["megatron", "hf"]
    for run in result["runs"]:
        assert "error" not in run, run.get("error")
        assert len(run["steps"]) == 2 and set(bench.STAGES) <= set(run["median"])
        assert run["mismatch_max"] < 1e-5  # fp32 on the CPU: the generator's logprobs are the trainer's
        assert all(step["generated_tokens"] > 0 for step in run["steps"])
    assert "Megatron generator / transformers generate" in capsys.readouterr().out


def test_the_gpu_defaults_are_a_half_to_one_billion_parameter_model(bench):
    from rlkit.models.factory import TinyModelSpec

    s = bench.FULL
    spec = TinyModelSpec(s["hidden"], s["layers"], s["heads"], s["kv_heads"], s["ffn"], vocab_size=s["vocab"])
    embeddings = 2 * s["vocab"] * s["hidden"]  # untied
    layer = 2 * s["hidden"] ** 2 + 2 * s["hidden"] * s["kv_heads"] * s["hidden"] // s["heads"] + 3 * s["hidden"] * s["ffn"]
    assert 0.5e9 < embeddings + s["layers"] * layer < 1e9 and spec.hidden_size == s["hidden"]
