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


def test_train_on_your_own_file_and_reward_function_with_an_sft_warm_start(tmp_path, monkeypatch):
    """Issue 30, items 1 and 3 from the command line: a JSONL of prompt/answer with SFT enabled (was refused
    whatever its columns) and a reward function named by import path from the working folder."""
    import sys

    from rlkit.tracking.runs import open_run
    from tests.reliability.own_task import task_overrides, write_task

    data = write_task(tmp_path / "work", module="cli_rewards")
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path / "work"))])
    overrides = task_overrides(tmp_path, data, **{"env.reward_fn": "cli_rewards:reverse_reward",
                                                  "logger.sample_table_period": 1,
                                                  "logger.sample_table_rows": None})  # the whole batch
    assert main(["train", "quickstart", *(f"{k}={'null' if v is None else v}" for k, v in overrides.items()),
                 "--quiet"]) == 0
    run = open_run(tmp_path / "runs" / "quickstart")
    assert run.summary["sft_steps"] == 2 and run.summary["rl_steps"] == 1
    samples = run.table("rollout/samples")
    grpo = run.config["grpo"]
    assert len(samples) == grpo["num_prompts_per_step"] * grpo["num_generations_per_prompt"] > 8
    answers = {r["prompt"]: r["answer"] for r in map(json.loads, data.read_text().splitlines())}
    reward = sys.modules["cli_rewards"].reverse_reward
    assert samples["reward"].tolist() == reward(None, list(samples["completion"]),
                                                [answers[p] for p in samples["prompt"]])
    sys.modules.pop("cli_rewards", None)


def nano_run(tmp_path, **extra):
    """quickstart_nano shrunk to seconds: the nano model made in tmp_path, 3 SFT steps, one RL step of 4 x 4."""
    values = {"policy.model_name": str(tmp_path / "model"), "sft.num_steps": 3, "sft.batch_size": 8,
              "sft.warmup_steps": 0, "grpo.max_num_steps": 1, "grpo.num_prompts_per_step": 4,
              "grpo.num_generations_per_prompt": 4, "eval.num_prompts": 8, "logger.log_dir": str(tmp_path / "runs")}
    return [f"{k}={v}" for k, v in dict(values, **extra).items()]


def chat_ids(folder):
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    chats = [[{"role": "user", "content": f"{a}+{b}="}, {"role": "assistant", "content": str(a + b)}]
             for a, b in ((3, 4), (2, 5))]
    texts = [tok.apply_chat_template(chat, tokenize=False) for chat in chats]
    return torch.tensor([tok(t, add_special_tokens=False)["input_ids"] for t in texts])  # [2, T], equal lengths


def test_train_export_writes_the_trained_policy_that_transformers_loads(tmp_path):
    """run_experiment(..., export=DIR), what `rlkit train --export DIR` calls: the folder's logits under
    transformers are the session's policy's after the run, within the fp32 conversion bound (1e-5 of the logits'
    scale, rlkit.models.compare), and not the base model's (the SFT steps moved the weights by far more)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlkit.config.loading import load_config
    from rlkit.experiment import run_experiment
    from rlkit.models.compare import logits_agreement
    from rlkit.session import Session

    config = load_config("quickstart_nano", nano_run(tmp_path))
    with Session(config) as session:
        summary = run_experiment(config, session=session, progress=False, export=tmp_path / "out")
        ids = chat_ids(tmp_path / "out")
        session.policy.model.eval()
        with torch.no_grad():
            policy = session.policy.adapter.logits(ids)
    assert summary["export"] == str((tmp_path / "out").resolve()) and summary["rl_steps"] == 1
    with torch.no_grad():
        exported, base = (AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()(ids).logits
                          for folder in (tmp_path / "out", tmp_path / "model"))
    agreement = logits_agreement(policy, exported)
    assert agreement.ok and agreement.bound <= 1e-4, agreement
    assert not logits_agreement(policy, base).ok  # the export is the trained policy, not the folder it started from


def test_rlkit_train_export_puts_the_folder_in_the_summary(tmp_path, capsys):
    """The command line's flag: the folder is written, and its path is in the printed summary and summary.json."""
    out = tmp_path / "export"
    assert main(["train", "quickstart_nano", *nano_run(tmp_path), "--export", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((tmp_path / "runs" / "quickstart_nano" / "summary.json").read_text())
    assert summary["export"] == json.loads(printed[printed.index("{\n"):])["export"] == str(out.resolve())
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    assert json.loads((out / "config.json").read_text()) == json.loads((tmp_path / "model" / "config.json").read_text())


def test_dpo_from_a_pairs_file_exports_the_model(tmp_path, capsys):
    """``rlkit dpo``: pairs from a JSONL file, the summary with the pair accuracy, an HF folder that loads."""
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 1)})
                             + "\n" for a in range(4) for b in range(4)))
    out = tmp_path / "out"
    assert main(["dpo", "quickstart_nano", f"policy.model_name={tmp_path / 'model'}",
                 f"logger.log_dir={tmp_path / 'runs'}", f"dpo.train_file={pairs}", "dpo.num_steps=2",
                 "dpo.batch_size=4", "--quiet", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    summary = json.loads(printed[printed.rindex("{\n"):])
    assert summary["dpo_steps"] == 2 and 0.0 <= summary["final_pair_accuracy"] <= 1.0
    assert summary["output"] == str(out) and (out / "config.json").exists()


def test_overrides_may_follow_the_options(tmp_path, capsys):
    """`rlkit train quickstart --quiet key=value`: the override reaches the config (here its typo is named), and a
    word that is not key=value is refused by name."""
    import pytest

    assert main(["train", "quickstart", "--quiet", "grpo.num_prompts_per_stp=4",
                 f"policy.model_name={tmp_path / 'x'}"]) == 2
    assert "did you mean grpo.num_prompts_per_step?" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "quickstart", "--quiet", "oops"])
    assert "unrecognized arguments: oops" in capsys.readouterr().err
