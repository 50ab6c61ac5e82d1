"""Where vLLM would run on this machine's CPU and its attention kernels lack the model's head size, validation switches
the run to the transformers generator with a one-line notice (rlkit.config.checks.generation_fallback); where the
config sets what only vLLM does, the refusal stays a problem with the reason. The head-size rule is vLLM's CPU
kernels', so these tests run where there is no CUDA (one says what a GPU machine gets, with CUDA stood in)."""

import json
import shutil
import warnings

import pytest
import torch

import rlkit
from rlkit.config import checks
from rlkit.config.checks import EngineFallbackWarning
from rlkit.config.loading import load_config
from rlkit.errors import ConfigError

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="vLLM's CPU kernels' head sizes")


@pytest.fixture
def head16(model_factory, tmp_path):
    """The nano llama with 4 heads of 16 (vLLM's CPU kernels take 32 and up): same weights, other head split."""
    folder = shutil.copytree(model_factory("nano", "llama"), tmp_path / "head16")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(cfg, num_attention_heads=4, num_key_value_heads=2, head_dim=16)))
    return str(folder)


def loaded(folder, preset="quickstart", **overrides):
    """The config and the fallback notices validation gave (every other warning left to the caller's filters)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", EngineFallbackWarning)
        config = load_config(preset, {"policy.model_preset": None, "policy.model_name": folder, **overrides})
    return config, [str(w.message) for w in caught if issubclass(w.category, EngineFallbackWarning)]


def problems_of(folder, **overrides):
    with pytest.raises(ConfigError) as info:
        load_config("quickstart", {"policy.model_preset": None, "policy.model_name": folder, **overrides})
    return info.value.problems


def test_a_head_size_vllm_cpu_lacks_gets_the_hf_generator_with_one_notice(head16):
    config, notices = loaded(head16)
    assert config.policy.generation.backend == "hf"
    (notice,) = notices
    assert "\n" not in notice
    assert notice.startswith("policy.generation.backend=vllm: vLLM's CPU attention kernels have no head size 16 ")
    assert "so this run generates with transformers generate (policy.generation.backend=hf)" in notice
    assert "set policy.generation.backend=hf (or megatron" in notice  # how to choose, and silence it
    # the rest of the generation section is the config's
    assert config.policy.generation.max_new_tokens == load_config("quickstart").policy.generation.max_new_tokens


def test_a_supported_head_size_stays_on_vllm(model_factory):
    config, notices = loaded(str(model_factory("nano", "llama")))  # head_dim 32
    assert config.policy.generation.backend == "vllm" and notices == []


def test_an_engine_the_user_chose_is_kept_silently(head16):
    for backend in ("hf", "megatron"):
        config, notices = loaded(head16, **{"policy.generation.backend": backend})
        assert config.policy.generation.backend == backend and notices == []


@pytest.mark.parametrize("setting, reason", [
    ({"policy.generation.vllm_cfg.precision": "bfloat16"},
     "policy.generation.vllm_cfg.precision=bfloat16 (transformers generate samples in float32)"),
    ({"policy.generation.colocated.enabled": False},
     "policy.generation.colocated.enabled=false (transformers generate runs in this process only)"),
])
def test_a_setting_only_vllm_honours_keeps_the_refusal_with_the_reason(head16, setting, reason):
    (problem,) = problems_of(head16, **setting)
    assert problem.startswith(f"policy.model_name={head16!r}: head_dim=16 is not supported by vLLM's CPU attention")
    assert f"rlkit switches to backend=hf by itself, but not with {reason}: drop that to let it" in problem


def test_settings_that_only_tune_vllm_do_not_block_the_fallback(head16):
    config, notices = loaded(head16, **{"policy.generation.vllm_cfg.kv_cache_space_gib": 0.5,
                                        "policy.generation.vllm_cfg.enable_prefix_caching": False})
    assert config.policy.generation.backend == "hf" and len(notices) == 1


def test_with_other_problems_only_those_are_reported(head16):
    problems = problems_of(head16, **{"grpo.num_prompts_per_step": 0})
    assert problems and all(p.startswith("grpo.num_prompts_per_step") for p in problems), problems


def test_no_fallback_where_the_engine_runs_elsewhere(head16, monkeypatch):
    # a Ray cluster's machines are not seen from here: the config's engine is kept
    config, notices = loaded(head16, **{"policy.ray_address": "ray://head:10001"})
    assert config.policy.generation.backend == "vllm" and notices == []
    # a CUDA machine (stood in: the test is about the decision, not the GPU) runs vLLM's GPU kernels
    monkeypatch.setattr(checks, "cuda_here", lambda: True)
    config, notices = loaded(head16)
    assert config.policy.generation.backend == "vllm" and notices == []


def test_a_session_samples_through_the_fallback(head16, tmp_path):
    overrides = {"policy.model_preset": None, "policy.model_name": head16, "logger.log_dir": str(tmp_path / "runs"),
                 "sft.enabled": False, "grpo.num_prompts_per_step": 2, "grpo.num_generations_per_prompt": 2,
                 "data.num_train": 16, "data.num_validation": 4, "eval.num_prompts": 4}
    with pytest.warns(EngineFallbackWarning, match="head size 16"):
        session = rlkit.Session.from_config("quickstart_nano", overrides)
    with session as s:
        assert s.config.policy.generation.backend == "hf"
        batch = s.logprobs(s.rollout())
        mask = batch.loss_mask
        # the transformers generator's logprobs of its samples are the policy's (the same weights, float32)
        assert (batch.generator_logprobs - batch.prev_logprobs)[mask].abs().max() < 1e-4
