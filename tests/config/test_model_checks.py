"""Config validation checks the model folder's files and vLLM's CPU head sizes, with the other problems."""

import json
import shutil

import pytest
import torch

from rlkit.config.loading import load_config
from rlkit.errors import ConfigError


def problems_of(overrides):
    with pytest.raises(ConfigError) as info:
        load_config("quickstart", {"policy.model_preset": None, **overrides})
    return info.value.problems


@pytest.fixture
def folder(model_factory, tmp_path):
    return shutil.copytree(model_factory("nano", "llama"), tmp_path / "model")


def test_corrupt_config_json_is_a_config_problem_naming_the_file(folder):
    (folder / "config.json").write_text("{\"hidden_size\": 64,")
    (problem,) = problems_of({"policy.model_name": str(folder)})
    assert problem.startswith(f"policy.model_name={str(folder)!r}: model config {str(folder / 'config.json')!r}")
    assert "not valid JSON" in problem


def test_truncated_weights_are_a_config_problem_naming_the_file(folder):
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    (problem,) = problems_of({"policy.model_name": str(folder)})
    assert f"weights file {str(weights)!r} is unreadable" in problem


@pytest.mark.skipif(torch.cuda.is_available(), reason="the head-size rule is vLLM's CPU kernels'")
def test_vllm_cpu_head_dim_is_reported_with_the_other_problems(folder):
    # (without a setting only vLLM honours, validation switches to backend=hf instead: test_generation_fallback.py)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(cfg, num_attention_heads=4, head_dim=16)))
    problems = problems_of({"policy.model_name": str(folder), "grpo.num_prompts_per_step": 0,
                            "policy.generation.vllm_cfg.precision": "bfloat16"})
    assert any(p.startswith("grpo.num_prompts_per_step") for p in problems)
    (head,) = [p for p in problems if "head_dim" in p]
    assert head.startswith(f"policy.model_name={str(folder)!r}: head_dim=16 is not supported by vLLM's CPU")
    assert "policy.generation.backend=hf" in head
    # transformers' generate has no such limit
    assert load_config("quickstart", {"policy.model_preset": None, "policy.model_name": str(folder),
                                      "policy.generation.backend": "hf"}).policy.generation.backend == "hf"
