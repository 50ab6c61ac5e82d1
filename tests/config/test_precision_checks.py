"""Precision settings the machine cannot honour are config problems, reported with the others before any
model or engine is built."""

import shutil

import pytest
import torch

from rlkit.config.loading import load_config
from rlkit.errors import ConfigError


@pytest.fixture
def folder(model_factory, tmp_path):
    return str(shutil.copytree(model_factory("nano", "llama"), tmp_path / "model"))


def problems_of(overrides):
    with pytest.raises(ConfigError) as info:
        load_config("quickstart", {"policy.model_preset": None, **overrides})
    return info.value.problems


@pytest.mark.skipif(torch.cuda.is_available(), reason="the rule is about machines without a CUDA GPU")
def test_fp8_generation_on_a_cpu_machine_is_refused_with_the_other_problems(folder):
    problems = problems_of({"policy.model_name": folder, "policy.generation.vllm_cfg.precision": "fp8",
                            "policy.megatron_cfg.context_parallel_size": 2})
    assert any(p.startswith("policy.generation.vllm_cfg.precision=fp8: vLLM's online FP8 weight quantization "
                            "needs a CUDA GPU") and "Fix: use bfloat16 or float32" in p for p in problems), problems
    assert any(p.startswith("policy.megatron_cfg.context_parallel_size=2: context parallelism needs Transformer "
                            "Engine") for p in problems), problems


def test_a_generator_precision_for_the_hf_generator_is_refused(folder):
    (problem,) = problems_of({"policy.model_name": folder, "policy.generation.backend": "hf",
                              "policy.generation.vllm_cfg.precision": "bfloat16"})
    assert problem.startswith("policy.generation.vllm_cfg.precision=bfloat16: only the vLLM generator")


def test_unknown_precisions_name_the_choices(folder):
    problems = problems_of({"policy.model_name": folder, "policy.precision": "float16"})
    assert any("policy.precision" in p and "'float32'" in p and "'bfloat16'" in p for p in problems), problems


def test_bf16_training_and_generation_validate(folder):
    cfg = load_config("quickstart", {"policy.model_preset": None, "policy.model_name": folder,
                                     "policy.precision": "bfloat16", "policy.generation.vllm_cfg.precision": "bfloat16"})
    assert cfg.policy.precision == "bfloat16" and cfg.policy.generation.vllm_cfg.precision == "bfloat16"
