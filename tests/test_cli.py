import json

from rlkit.cli import main


def test_make_model_and_config_errors_exit_cleanly(tmp_path, capsys):
    assert main(["make-model", str(tmp_path / "m"), "--preset", "nano", "--family", "qwen2"]) == 0
    assert json.loads((tmp_path / "m" / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    assert main(["train", "quickstrat"]) == 2
    assert "did you mean 'quickstart'" in capsys.readouterr().err
    assert main(["train", "quickstart", "grpo.num_prompts_per_stp=4", f"policy.model_name={tmp_path / 'x'}"]) == 2
    err = capsys.readouterr().err
    assert "did you mean grpo.num_prompts_per_step?" in err and not (tmp_path / "x").exists()


def test_make_model_offers_every_family_the_factory_makes(tmp_path, capsys):
    from typing import get_args

    from rlkit.cli import MODEL_FAMILIES
    from rlkit.models.factory import ModelFamily

    assert MODEL_FAMILIES == get_args(ModelFamily)
    assert main(["make-model", str(tmp_path / "moe"), "--preset", "nano-moe", "--family", "mixtral"]) == 0
    config = json.loads((tmp_path / "moe" / "config.json").read_text())
    assert config["architectures"] == ["MixtralForCausalLM"] and config["num_local_experts"] == 4
    assert "mixtral preset 'nano-moe'" in capsys.readouterr().out


def test_demo_on_a_moe_model_reports_agreement_after_the_refit(capsys):
    """`rlkit demo`: generate, score with the policy, train, refit, generate again (real vLLM and Megatron)."""
    assert main(["demo", "--preset", "nano-moe", "--family", "mixtral"]) == 0
    out = capsys.readouterr().out
    assert "model: nano-moe mixtral" in out
    assert "generator and policy agree within 1e-3 before and after the refit: yes" in out
