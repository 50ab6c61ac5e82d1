"""Prompts too long for a rollout are found when the data loads: dropped with a count, or refused by row."""

import json

import pytest

from rlkit.config.components import GenerationConfig, PolicyConfig, VllmConfig
from rlkit.data import DataParams, load_prompt_dataset
from rlkit.data.lengths import prompt_token_lengths
from rlkit.errors import DataError
from rlkit.models.tokenizer import build_char_tokenizer

TOK = build_char_tokenizer()  # <|bos|><|user|>...<|end|><|assistant|>: 4 tokens + one per character


def write(tmp_path, prompts):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "answer": "1"}) + "\n" for p in prompts))
    return str(path)


def test_lengths_are_the_rollouts_rendered_lengths():
    assert prompt_token_lengths(TOK, ["1+2", "x" * 30]) == [7, 34]
    assert prompt_token_lengths(TOK, ["1+2"], system_prompt="ab") == [7 + 4]  # <|system|>ab<|end|>


def test_max_prompt_tokens_is_the_engine_length_minus_new_tokens():
    assert PolicyConfig().max_prompt_tokens == 64 - 16
    policy = PolicyConfig(generation=GenerationConfig(max_new_tokens=8, vllm_cfg=VllmConfig(max_model_len=100)))
    assert policy.max_prompt_tokens == 92


def test_filter_drops_overlong_rows_with_a_count(tmp_path):
    prompts = [f"{i}+{i}" for i in range(8)] + ["x" * 30, "y" * 40]  # 7 tokens each; 34 and 44
    path = write(tmp_path, prompts)
    with pytest.warns(UserWarning, match=r"dropped 2 of 10 prompt\(s\) in .*p\.jsonl' longer than the 10 tokens.*"
                                         r"first: line 9 \(34 tokens"):
        ds = load_prompt_dataset({"path": path, "validation_fraction": 0.25}, TOK, 10)
    kept = list(ds["train"]["prompt"]) + list(ds["validation"]["prompt"])
    assert sorted(kept) == sorted(prompts[:8])
    # without a tokenizer nothing is checked (the data layer alone knows no limit)
    assert len(load_prompt_dataset({"path": path, "validation_fraction": 0.25})["train"]) > 0


def test_error_mode_names_the_row(tmp_path):
    path = write(tmp_path, ["1+1", "2+2", "z" * 20, "3+3"])
    with pytest.raises(DataError) as info:
        load_prompt_dataset({"path": path, "overlong_prompts": "error"}, TOK, 10)
    (problem,) = info.value.problems
    assert problem.startswith(f"data.overlong_prompts=error: {path!r} line 3 renders (chat template applied) to 24 "
                              "tokens, more than the 10 tokens a rollout can take")
    assert "'zzzzzzzzzzzzzzzzzzzz'" in problem and "1 such row(s)" in problem


def test_generated_task_is_checked_per_split():
    params = DataParams(task="arithmetic", digits=3, num_train=50, num_validation=10, overlong_prompts="error")
    with pytest.raises(DataError, match=r"the generated train split row 0 renders .* to \d+ tokens, more than the 6"):
        load_prompt_dataset(params, TOK, 6)
    assert len(load_prompt_dataset(params, TOK, 12)["train"]) == 50  # 3-digit sums fit in 4 + 7 tokens


def test_bad_setting_is_a_problem():
    assert any(p.startswith("data.overlong_prompts") for p in DataParams(task="arithmetic", overlong_prompts="drop").problems())


def test_the_json_tools_a_rollout_renders_count_in_a_prompts_length(tmp_path):
    """A native-tool environment's tools are rendered into every prompt (the BPE template lists them in the system
    turn); a prompt that fits without them but not with them is dropped, as its rollout would not fit."""
    from rlkit.envs.registry import environment_tool_schemas
    from rlkit.models.bpe import build_bpe_tokenizer

    tok, tools = build_bpe_tokenizer(), environment_tool_schemas("tool_arithmetic_native")
    prompts = ["What is 12+34?", "What is 5+6?"]
    bare, with_tools = prompt_token_lengths(tok, prompts), prompt_token_lengths(tok, prompts, tools=tools)
    assert all(w > b for w, b in zip(with_tools, bare))
    limit = max(bare)  # every prompt fits alone; none with the tools
    path = write(tmp_path, prompts)
    assert len(load_prompt_dataset({"path": path, "validation_path": path}, tok, limit)["train"]) == 2
    with pytest.raises(DataError, match=rf"renders \(chat template applied\) to {with_tools[0]} tokens"):
        load_prompt_dataset({"path": path, "validation_path": path, "overlong_prompts": "error"}, tok, limit,
                            tools=tools)
