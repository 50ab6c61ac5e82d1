"""Config loading: every preset validates; all problems are reported together, before any model loads."""

import warnings

import pytest

from rlkit.config.loading import available_presets, load_config, parse_overrides
from rlkit.errors import ConfigError


# presets for the user's own checkpoint leave policy.model_name to them (???): give them a tiny one of the family
USER_MODELS = {"math_qwen3": ("nano", "qwen3"), "quickstart_lora": ("tiny", "llama")}  # (the warm start's folder)


@pytest.mark.parametrize("preset", available_presets())
def test_every_shipped_preset_loads(preset, model_factory):
    overrides = []
    if preset in USER_MODELS:
        overrides = [f"policy.model_name={model_factory(*USER_MODELS[preset], tokenizer='bpe')}"]
    config = load_config(preset, overrides)
    assert config.grpo.num_prompts_per_step >= 1


def test_overrides_are_typed():
    config = load_config("quickstart", ["grpo.num_generations_per_prompt=4", "loss_fn.ratio_clip_max=0.28",
                                        'policy.generation.stop_strings=["\\n"]'])
    assert config.grpo.num_generations_per_prompt == 4 and config.loss_fn.ratio_clip_max == 0.28
    assert config.policy.generation.stop_strings == ("\n",)
    assert load_config("quickstart", {"grpo.num_epochs": 2}).grpo.num_epochs == 2
    # numbers YAML 1.1 leaves as strings are floats (a sweep's base overrides go through the same parser)
    assert parse_overrides(["policy.optimizer.lr=3e-4", "seed=1E3", "name=run-3e-4", "policy.generation.top_k=",
                            "data.answer_key='3e-4'", 'data.prompt_key="1.5"']) == {
        "policy.optimizer.lr": 0.0003, "seed": 1000.0, "name": "run-3e-4", "policy.generation.top_k": None,
        "data.answer_key": "3e-4", "data.prompt_key": "1.5"}  # quoted, a number stays a string


def test_all_problems_reported_together_before_any_model_loads(tmp_path):
    model = tmp_path / "model"
    with pytest.raises(ConfigError) as err:
        load_config("quickstart", [
            f"policy.model_name={model}",
            "grpo.num_generatons_per_prompt=4",  # typo
            "policy.train_micro_batch_size=many",  # wrong type
            "policy.train_global_batch_size=48",  # does not divide 16 x 8 = 128
            "loss_fn.policy_loss=ppo",  # unknown variant
        ])
    text = str(err.value)
    assert "grpo.num_generatons_per_prompt: unknown key; did you mean grpo.num_generations_per_prompt?" in text
    assert "policy.train_micro_batch_size" in text and "'many'" in text
    assert "loss_fn.policy_loss" in text and "ppo_clip" in text
    assert len(err.value.problems) >= 4
    assert not model.exists()  # nothing was created or loaded


def test_impossible_combinations_name_keys_and_fixes():
    with pytest.raises(ConfigError) as err:
        load_config("quickstart", ["policy.train_micro_batch_size=48", "policy.megatron_cfg.tensor_model_parallel_size=3",
                                   "policy.model_name=/nonexistent", "policy.model_preset=null"])
    text = str(err.value)
    assert "policy.train_micro_batch_size=48: must divide the global batch (128); e.g. use 32" in text
    assert "rlkit make-model /nonexistent" in text
    assert "`rlkit sft quickstart --output /nonexistent`" in text  # the warm start quickstart_lora's folder holds


def test_parallel_layout_rules(tmp_path):
    from rlkit.config.backends import MegatronConfig, parallel_layout_problems

    model = {"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, "num_hidden_layers": 4}
    assert parallel_layout_problems(MegatronConfig(tensor_model_parallel_size=2), model, world_size=2) == []
    problems = parallel_layout_problems(MegatronConfig(tensor_model_parallel_size=4), model, world_size=4)
    assert any("num_key_value_heads=2" in p for p in problems)
    problems = parallel_layout_problems(MegatronConfig(tensor_model_parallel_size=2), model, world_size=3)
    assert any("must divide the world size 3" in p for p in problems)


def test_unknown_preset_suggests_the_nearest():
    with pytest.raises(ConfigError, match="did you mean 'quickstart'"):
        load_config("quickstrat")


def test_base_inheritance(tmp_path):
    (tmp_path / "mine.yaml").write_text("base: quickstart\ngrpo:\n  num_epochs: 3\n")
    config = load_config(tmp_path / "mine.yaml")
    assert config.grpo.num_epochs == 3 and config.grpo.num_prompts_per_step == 16


def test_a_preset_model_is_checked_before_it_is_made(tmp_path):
    """The layout is checked against the config the preset will make (nothing is made while checking)."""
    model = tmp_path / "moe"
    overrides = [f"policy.model_name={model}", "policy.model_preset=nano-moe", "policy.model_family=mixtral",
                 "policy.num_workers=2"]
    load_config("quickstart", overrides + ["policy.megatron_cfg.expert_model_parallel_size=2"])
    with pytest.raises(ConfigError) as err:
        load_config("quickstart", overrides + ["policy.megatron_cfg.expert_model_parallel_size=3",
                                               "policy.megatron_cfg.tensor_model_parallel_size=2"])
    text = str(err.value)
    assert "expert_model_parallel_size=3: must divide num_local_experts=4" in text
    assert "tensor_model_parallel_size=2: must divide num_key_value_heads=1" in text
    assert not model.exists()


def test_an_existing_folder_with_another_model_than_the_preset_is_warned_about(tmp_path, model_factory):
    dense = model_factory("nano", "llama")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config("quickstart", [f"policy.model_name={dense}", "policy.model_preset=nano"])  # the same model
    with pytest.warns(UserWarning) as caught:  # pointing a preset's run at one's own model is normal use
        config = load_config("quickstart", [f"policy.model_name={dense}", "policy.model_preset=nano-moe",
                                            "policy.model_family=mixtral"])
    text = str(caught[0].message)
    assert "already holds a different model (LlamaForCausalLM, hidden 64, 2 layers, 2 heads)" in text
    assert "MixtralForCausalLM, hidden 64, 2 layers, 2 heads, 4 experts" in text
    assert "point policy.model_name at a new folder" in text and "the existing model is used" in text
    assert config.policy.model_name == str(dense)
