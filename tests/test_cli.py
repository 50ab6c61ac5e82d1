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
