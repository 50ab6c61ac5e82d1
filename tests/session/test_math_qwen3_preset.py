"""The math_qwen3 preset, the shape of a real run, for two GRPO steps: a tiny random Qwen3 with the BPE
tokenizer in place of the user's checkpoint, eight GSM8K-style rows in a local JSONL folder in place of the hub
dataset, everything else (math-verify env, system turn, GSM8K answer extraction, vLLM, Megatron) as shipped."""

import json
import math

import pytest

import rlkit
from rlkit.config.loading import load_config
from rlkit.envs.math import MathEnvironment
from rlkit.errors import ConfigError


def gsm8k_folder(folder):
    folder.mkdir()
    rows = [{"question": f"Tom has {a} apples and buys {b} more. How many apples does he have?",
             "answer": f"Tom has {a} + {b} = {a + b} apples.\n#### {a + b:,}"} for a, b in
            [(3, 4), (12, 30), (7, 8), (950, 70), (21, 21), (5, 6), (40, 2), (13, 9), (8, 8), (1, 99)]]
    for split, part in (("train", rows[:8]), ("test", rows[8:])):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    return folder


def tiny_run(model, data, log_dir) -> list[str]:
    """Overrides that shrink the preset to two steps; the model and dataset keys stand in for the user's."""
    return [f"policy.model_name={model}", f"data.dataset_name={data}", "data.dataset_config=null",
            "policy.max_total_sequence_length=160", "policy.generation.max_new_tokens=24",
            "policy.train_micro_batch_size=8", "policy.logprob_batch_size=8", "grpo.num_prompts_per_step=2",
            "grpo.num_generations_per_prompt=4", "grpo.max_num_steps=2", "eval.num_prompts=2",
            f"logger.log_dir={log_dir}"]


def test_the_preset_needs_the_users_model():
    with pytest.raises(ConfigError) as info:
        load_config("math_qwen3")
    assert info.value.problems == ["policy.model_name: this config leaves it for you to set (it says ???). Fix: give "
                                   "it, e.g. `policy.model_name=...` after the config on the command line"]


def test_math_qwen3_runs_two_steps_on_a_tiny_qwen3_and_local_rows(model_factory, tmp_path):
    model = model_factory("nano", "qwen3", tokenizer="bpe")
    overrides = tiny_run(model, gsm8k_folder(tmp_path / "gsm8k"), tmp_path / "runs")
    session = rlkit.Session.from_config("math_qwen3", overrides)
    try:
        assert isinstance(session.env, MathEnvironment)
        assert session.dataset["validation"]["answer"] == ["16", "100"]  # the test split, '####' answers
        assert "1020" in session.dataset["train"]["answer"]  # "#### 1,020"
        history = session.run(2, progress=False)
        assert len(history) == 2
        for m in history:
            assert math.isfinite(m["train/loss"]) and math.isfinite(m["train/grad_norm"])
            assert abs(m["train/token_mult_prob_error"] - 1) < 1e-3  # vLLM and Megatron agree on the Qwen3
        prompt = session.batch.prompts[0]
        assert prompt.startswith("<|im_start|>system\nSolve the math problem step by step. Put the final answer in "
                                 "\\boxed{}.<|im_end|>\n<|im_start|>user\nTom has ")
        assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n")
        # the extracted answer is what math-verify compares the boxed reply with
        row = session.batch.rows[0]
        replies = [f"So he has \\boxed{{{row['answer']}}}.", "\\boxed{-1}"]
        scored = session.env.step([[{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": r}]
                                   for r in replies], [row, row])
        assert scored.rewards.tolist() == [1.0, 0.0]
    finally:
        session.close()
