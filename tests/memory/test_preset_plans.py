"""The memory plan of every shipped preset, on each backend and engine and the settings whose parts differ by
backend, byte for byte against figures recorded before the plan read its facts from the backend and engine
sections instead of their names (preset_plans.json; a hand-countable model, a CPU and a CUDA device)."""

import json
from pathlib import Path

import pytest

from rlkit.config.loading import available_presets, load_config
from rlkit.memory.plan import GIB, Device, plan_memory

HF = dict(model_type="llama", vocab_size=64, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
          num_attention_heads=2, num_key_value_heads=1, head_dim=4, tie_word_embeddings=False,
          max_position_embeddings=128)
DEVICES = {"cpu": Device("cpu", 100 * GIB, "test CPU"), "cuda": Device("cuda", 80 * GIB, "test GPU")}
LORA = ["policy.lora_cfg.enabled=true", "policy.lora_cfg.dim=2"]
VARIANTS = {
    "base": [], "dtensor": ["policy.backend=dtensor"], "hf": ["policy.backend=hf", "policy.precision=float32"],
    "bf16": ["policy.precision=bfloat16"], "dtensor_bf16": ["policy.backend=dtensor", "policy.precision=bfloat16"],
    "pure_bf16": ["policy.precision=bfloat16", "policy.optimizer.main_params_dtype=bfloat16"],
    "lora_bf16": LORA + ["policy.precision=bfloat16"],
    "lora_release": LORA + ["policy.lora_cfg.release_base_while_generating=true",
                            "policy.generation.vllm_cfg.release_weights_for_training=true"],
    "release": ["policy.generation.vllm_cfg.release_weights_for_training=true"],
    "gen_hf": ["policy.generation.backend=hf", "policy.generation.vllm_cfg.precision=float32"],
    "selective": ["policy.megatron_cfg.recompute_granularity=selective"],
    "full": ["policy.megatron_cfg.recompute_granularity=full", "policy.megatron_cfg.recompute_method=uniform",
             "policy.megatron_cfg.recompute_num_layers=1"],
    "dtensor_ckpt": ["policy.backend=dtensor", "policy.dtensor_cfg.activation_checkpointing=true"],
    "tp2": ["policy.num_workers=2", "policy.megatron_cfg.tensor_model_parallel_size=2"],
    "dtensor_w2": ["policy.backend=dtensor", "policy.num_workers=2"],
}
NO_MODEL = ("math_qwen3", "quickstart_lora")  # presets for a model folder of yours: a preset model stands in
RECORDED = json.loads((Path(__file__).parent / "preset_plans.json").read_text())


def test_every_shipped_preset_has_recorded_figures():
    assert {key.split("/")[0] for key in RECORDED["plans"]} == set(available_presets())


@pytest.mark.parametrize("preset", available_presets())
def test_the_plan_of_every_shipped_preset_is_unchanged(preset):
    own = ["policy.model_name=/nonexistent/plan-model", "policy.model_preset=tiny"] if preset in NO_MODEL else []
    distilled = load_config(preset, own).distillation.enabled
    if distilled:  # a teacher folder not made: counted at the student's shape
        own += ["distillation.teacher_model_name=/nonexistent/plan-teacher"]
    checked = 0
    for variant, overrides in VARIANTS.items():
        if f"{preset}/{variant}/cpu" not in RECORDED["plans"]:  # a layout the preset's model refuses
            continue
        config = load_config(preset, own + overrides)
        for device_name, device in DEVICES.items():
            parts = plan_memory(config, HF, device).parts
            expected = dict(zip(RECORDED["parts"], RECORDED["plans"][f"{preset}/{variant}/{device_name}"]))
            assert parts == expected, (variant, device_name)
            checked += 1
    # every layout but one the preset's model refuses; distillation also refuses the two Ray worker groups
    assert checked >= 2 * (len(VARIANTS) - (2 if distilled else 1))
