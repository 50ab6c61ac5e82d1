"""bench/gpu_check.py's code path on the CPU at a tiny size: both families, both backends in bf16, the logprob
gap against transformers' fp32 forward, a profiled step, one JSON and the table. Timings are not asserted
(benchmarks report speed, tests check code); the GPU defaults are checked to be the ~1B models the README's
figures are about."""

import json

import pytest
import torch

from tests.bench import bench_script


@pytest.fixture(scope="module")
def bench():
    return bench_script("gpu_check")


def test_gpu_check_runs_both_backends_on_tiny_models(bench, tmp_path, capsys):
    out = tmp_path / "gpu_check.json"
    bench.main(["--tiny", "--steps", "1", "--warmup", "0", "--profile", "--out", str(out)])
    result = json.loads(out.read_text())
    assert [f["family"] for f in result["families"]] == ["llama", "qwen3"]
    for fam in result["families"]:
        assert fam["errors"] == {}
        for backend in ("megatron", "dtensor"):
            row = fam[backend]
            assert row["steps"] == 1 and row["step_s"] > 0 and row["tokens_per_s"] == pytest.approx(4 * 32 / row["step_s"])
            gap = fam[f"{backend}_bf16_vs_fp32_logprob_gap"]
            assert 1e-4 < gap["max"] < 0.05 and gap["mean"] < 0.01, gap  # bf16 ran, and close to fp32
        for backend in ("megatron", "dtensor"):  # --profile: one more step each, its operators by own time
            assert "aten::mm" in fam[f"{backend}_profile"] and "Self CPU time total" in fam[f"{backend}_profile"]
        assert fam["megatron_over_dtensor_step_time"] == pytest.approx(fam["megatron"]["step_s"] / fam["dtensor"]["step_s"])
    printed = capsys.readouterr().out
    assert "FAILED" not in printed and printed.count("Megatron / DTensor step time:") == 2


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_the_gpu_models_have_about_a_billion_parameters(bench, family):
    from transformers import AutoModelForCausalLM

    from rlkit.models.factory import TinyModelSpec, hf_config

    s = bench.FULL
    spec = TinyModelSpec(s["hidden"], s["layers"], s["heads"], s["kv_heads"], s["ffn"], vocab_size=s["vocab"])
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config(spec, family))
    assert 0.95e9 < sum(p.numel() for p in model.parameters()) < 1.05e9
