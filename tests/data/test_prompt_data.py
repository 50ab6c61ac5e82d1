"""Prompt datasets from the generated task and from real JSONL/parquet files, and chat rendering."""

import json

import pytest
from datasets import Dataset

from rlkit.data import DataParams, load_prompt_dataset, render_prompt_texts, render_prompts
from rlkit.errors import ConfigError, ModelError
from rlkit.models.tokenizer import build_char_tokenizer


def test_generated_splits_sizes_answers_and_determinism():
    source = {"task": "arithmetic", "digits": 2, "num_train": 300, "num_validation": 40, "seed": 3}
    ds = load_prompt_dataset(source)
    assert (len(ds["train"]), len(ds["validation"])) == (300, 40)
    assert ds["train"].column_names == ["prompt", "answer"]
    assert all(str(eval(r["prompt"])) == r["answer"] for r in ds["train"])  # noqa: S307 - digits and '+'
    assert len(set(ds["validation"]["prompt"])) == 40  # validation prompts are distinct
    again = load_prompt_dataset(DataParams(task="arithmetic", digits=2, num_train=300, num_validation=40, seed=3))
    assert again["train"].to_list() == ds["train"].to_list()
    other = load_prompt_dataset({**source, "seed": 4})
    assert other["validation"]["prompt"] != ds["validation"]["prompt"]


def test_generated_splits_are_disjoint_even_in_a_tiny_prompt_space():
    # digits=1 has 100 distinct prompts; 500 train rows drawn from them would hit any validation prompt.
    ds = load_prompt_dataset({"task": "arithmetic", "digits": 1, "num_train": 500, "num_validation": 30})
    assert not set(ds["train"]["prompt"]) & set(ds["validation"]["prompt"])
    assert len(set(ds["train"]["prompt"])) == 70  # and train covers everything else


def test_generated_config_problems_are_reported_together():
    with pytest.raises(ConfigError, match="allows only 100"):
        load_prompt_dataset({"task": "arithmetic", "digits": 1, "num_validation": 100})
    with pytest.raises(ConfigError, match=r"data.num_trian: unknown key; did you mean data.num_train\?"):
        load_prompt_dataset({"task": "arithmetic", "num_trian": 5})
    with pytest.raises(ConfigError, match=r"data.digits: Input should be a valid integer.* \(got 'two'\)"):
        load_prompt_dataset({"task": "arithmetic", "digits": "two"})
    with pytest.raises(ConfigError) as info:
        load_prompt_dataset({"task": "arithmetic", "digits": 0, "num_train": 0})
    assert len(info.value.problems) == 2
    with pytest.raises(ConfigError, match="set exactly one"):
        load_prompt_dataset(DataParams())


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_jsonl_with_custom_prompt_column_and_fraction_split(tmp_path):
    # 20 distinct questions, each twice: a row-level split would leak duplicates into both splits.
    rows = [{"question": f"q{i}", "answer": str(i)} for i in range(20)] * 2
    path = _write_jsonl(tmp_path / "qa.jsonl", rows)
    ds = load_prompt_dataset({"path": path, "prompt_key": "question", "validation_fraction": 0.25, "seed": 1})
    assert ds["train"].column_names == ["prompt", "answer"]
    train, val = set(ds["train"]["prompt"]), set(ds["validation"]["prompt"])
    assert len(val) == 5 and len(train) == 15 and not train & val
    assert (len(ds["train"]), len(ds["validation"])) == (30, 10)
    again = load_prompt_dataset({"path": path, "prompt_key": "question", "validation_fraction": 0.25, "seed": 1})
    assert set(again["validation"]["prompt"]) == val
    reseeded = load_prompt_dataset({"path": path, "prompt_key": "question", "validation_fraction": 0.25, "seed": 2})
    assert set(reseeded["validation"]["prompt"]) != val  # the held-out prompts are drawn from the seed


def test_parquet_with_separate_validation_file_and_plain_path_source(tmp_path):
    Dataset.from_list([{"prompt": f"p{i}", "answer": str(i)} for i in range(6)]).to_parquet(str(tmp_path / "t.parquet"))
    _write_jsonl(tmp_path / "v.jsonl", [{"prompt": "v0", "answer": "0"}])
    ds = load_prompt_dataset(DataParams(path=str(tmp_path / "t.parquet"), validation_path=str(tmp_path / "v.jsonl")))
    assert ds["train"]["prompt"] == [f"p{i}" for i in range(6)] and ds["validation"]["prompt"] == ["v0"]
    plain = load_prompt_dataset(tmp_path / "t.parquet")  # a bare path: default 10% validation
    assert len(plain["validation"]) == 1 and len(plain["train"]) == 5


def test_file_errors_say_what_to_fix(tmp_path):
    with pytest.raises(ConfigError, match="no such file 'missing.jsonl'"):
        load_prompt_dataset({"path": "missing.jsonl"})
    with pytest.raises(ConfigError, match="not a .jsonl, .json or .parquet"):
        load_prompt_dataset({"path": str(tmp_path / "data.csv")})
    path = _write_jsonl(tmp_path / "qa.jsonl", [{"question": "a", "answer": "1"}])
    with pytest.raises(ConfigError, match=r"has no column 'prompt'; its columns are \['question', 'answer'\]"):
        load_prompt_dataset(path)
    with pytest.raises(ConfigError, match="validation split is empty"):
        load_prompt_dataset({"path": path, "prompt_key": "question", "validation_fraction": 0.2})
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ConfigError, match="is empty"):
        load_prompt_dataset(str(tmp_path / "empty.jsonl"))


def test_render_prompts_with_the_char_tokenizer():
    tok = build_char_tokenizer()
    ids = render_prompts(tok, ["1+2", "34"])
    assert tok.convert_ids_to_tokens(ids[0]) == ["<|bos|>", "<|user|>", "1", "+", "2", "<|end|>", "<|assistant|>"]
    assert len(ids[1]) == 6  # 5 fixed tokens + one per character of "34"
    text = render_prompt_texts(tok, ["1+2"], system_prompt="be brief")[0]
    assert text == "<|bos|><|system|>be brief<|end|><|user|>1+2<|end|><|assistant|>"
    assert render_prompts(tok, ["1+2"], system_prompt="be brief")[0] == tok.encode(text, add_special_tokens=False)


def test_tokenizer_without_chat_template_is_a_model_error():
    tok = build_char_tokenizer()
    tok.chat_template = None
    with pytest.raises(ModelError, match=r"no chat template.*tokenizer.chat_template.*rlkit make-model"):
        render_prompts(tok, ["1+2"])
