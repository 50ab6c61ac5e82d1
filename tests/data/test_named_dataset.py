"""Datasets by name (data.dataset_name) through datasets.load_dataset, offline on real local folders: JSONL
and parquet files named by split, a save_to_disk folder, column mapping, GSM8K answers, and one clear error for
a missing column, a missing or empty split, or a dataset that does not load."""

import json
import warnings

import pytest
from datasets import Dataset, DatasetDict

from rlkit.config.loading import load_config
from rlkit.data import DataParams, load_prompt_dataset
from rlkit.errors import ConfigError, DataError
from rlkit.models.tokenizer import build_char_tokenizer


def gsm8k_rows(start: int, n: int) -> list[dict]:
    return [{"question": f"Tom has {i} apples and buys 2 more. How many does he have?",
             "answer": f"He has {i} + 2 = {i + 2} apples.\n#### {i + 2:,}", "id": i} for i in range(start, start + n)]


@pytest.fixture
def jsonl_folder(tmp_path):
    folder = tmp_path / "gsm"
    folder.mkdir()
    for split, rows in (("train", gsm8k_rows(995, 12)), ("test", gsm8k_rows(2000, 4))):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


GSM8K = {"prompt_key": "question", "answer_key": "answer", "answer_format": "gsm8k"}


def test_a_local_jsonl_folder_with_named_splits_and_column_mapping(jsonl_folder):
    ds = load_prompt_dataset({"dataset_name": str(jsonl_folder), "validation_split": "test", **GSM8K})
    assert (len(ds["train"]), len(ds["validation"])) == (12, 4)
    assert ds["train"].column_names == ["prompt", "answer", "id"]
    assert ds["train"][0] == {"prompt": "Tom has 995 apples and buys 2 more. How many does he have?",
                              "answer": "997", "id": 995}
    assert ds["train"][5]["answer"] == "1002"  # "#### 1,002": the thousands separator is dropped
    assert ds["validation"]["answer"] == ["2002", "2003", "2004", "2005"]


def test_parquet_folder_with_a_held_out_fraction_and_plain_answers(tmp_path):
    folder = tmp_path / "pq"
    folder.mkdir()
    rows = [{"q": f"{i}+1=", "a": str(i + 1)} for i in range(20)] * 2
    Dataset.from_list(rows).to_parquet(str(folder / "data.parquet"))
    params = DataParams(dataset_name=str(folder), prompt_key="q", answer_key="a", validation_fraction=0.25, seed=2)
    ds = load_prompt_dataset(params)
    train, validation = set(ds["train"]["prompt"]), set(ds["validation"]["prompt"])
    assert (len(train), len(validation)) == (15, 5) and not train & validation  # duplicates held out together
    assert ds["train"].column_names == ["prompt", "answer"]
    assert all(row["answer"] == str(int(row["prompt"][:-3]) + 1) for row in ds["train"])


def test_a_save_to_disk_folder_loads_with_its_splits(tmp_path):
    DatasetDict(train=Dataset.from_list(gsm8k_rows(0, 6)), test=Dataset.from_list(gsm8k_rows(50, 3))).save_to_disk(
        str(tmp_path / "saved"))
    ds = load_prompt_dataset({"dataset_name": str(tmp_path / "saved"), "validation_split": "test", **GSM8K})
    assert ds["validation"]["answer"] == ["52", "53", "54"] and len(ds["train"]) == 6


def test_missing_columns_are_one_error_naming_each_column(jsonl_folder):
    with pytest.raises(DataError) as info:
        load_prompt_dataset({"dataset_name": str(jsonl_folder), "prompt_key": "problem", "answer_key": "solution"})
    assert len(info.value.problems) == 2
    prompt, answer = info.value.problems
    assert prompt.startswith("data.prompt_key='problem'") and "split 'train' has no column 'problem'" in prompt
    assert "['question', 'answer', 'id']" in prompt
    assert answer.startswith("data.answer_key='solution'") and "no column 'solution'" in answer
    with pytest.raises(DataError) as info:  # a wrong split and a wrong column: both in the one error
        load_prompt_dataset({"dataset_name": str(jsonl_folder), "prompt_key": "problem", "validation_split": "dev"})
    assert [p.split(":")[0] for p in info.value.problems] == ["data.validation_split='dev'", "data.prompt_key='problem'"]


def test_a_missing_or_empty_split_is_one_error_naming_the_split(jsonl_folder, tmp_path):
    with pytest.raises(DataError) as info:
        load_prompt_dataset({"dataset_name": str(jsonl_folder), "split": "training", **GSM8K})
    assert info.value.problems == [f"data.split='training': dataset {str(jsonl_folder)!r} has no split 'training'; "
                                   "its splits are ['train', 'test']. Fix: set data.split to one of them"]
    (jsonl_folder / "test.jsonl").write_text("")  # an empty split file
    with pytest.raises(DataError) as info:
        load_prompt_dataset({"dataset_name": str(jsonl_folder), "validation_split": "test", **GSM8K})
    assert info.value.problems == [f"data.validation_split='test': split 'test' of dataset {str(jsonl_folder)!r} is "
                                   "empty (no rows). Fix: choose a split with rows"]
    # the empty split does not stop a run that does not use it
    assert len(load_prompt_dataset({"dataset_name": str(jsonl_folder), **GSM8K})["train"]) > 0
    saved = tmp_path / "saved"
    DatasetDict(train=Dataset.from_list(gsm8k_rows(0, 4))).save_to_disk(str(saved))
    with pytest.raises(DataError, match=r"data.validation_split='dev': .* no split 'dev'; its splits are \['train'\]"):
        load_prompt_dataset({"dataset_name": str(saved), "validation_split": "dev", **GSM8K})


def test_a_gsm8k_answer_without_its_marker_names_the_row(tmp_path):
    rows = gsm8k_rows(0, 3)
    rows[1]["answer"] = "just 3"
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"answer_format=gsm8k: dataset .* split 'train' row 1: the answer 'just 3'"):
        load_prompt_dataset({"dataset_name": str(folder), **GSM8K})


def test_a_dataset_that_does_not_load_names_the_key_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(DataError) as info:
        load_prompt_dataset({"dataset_name": "nobody/no-such-dataset"})
    text = info.value.problems[0]
    assert text.startswith("data.dataset_name='nobody/no-such-dataset': datasets.load_dataset could not load it")
    assert "hub is off here" in text and "save_to_disk" in text
    (tmp_path / "nothing").mkdir()
    with pytest.raises(DataError, match=r"data.dataset_name='.*nothing': .*Fix: give the folder parquet or JSONL"):
        load_prompt_dataset({"dataset_name": str(tmp_path / "nothing")})


def test_over_long_prompts_of_a_named_dataset_are_dropped_with_a_count(tmp_path):
    rows = [{"question": f"{i}+1=", "answer": str(i + 1)} for i in range(5)] + [{"question": "9" * 40 + "+1="}] * 2
    folder = tmp_path / "long"
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    params = DataParams(dataset_name=str(folder), prompt_key="question", validation_fraction=0.5, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = load_prompt_dataset(params, build_char_tokenizer(), max_prompt_tokens=20)
    assert sorted(list(ds["train"]["prompt"]) + list(ds["validation"]["prompt"])) == [f"{i}+1=" for i in range(5)]
    assert any(f"dropped 2 of 7 prompt(s) in dataset {str(folder)!r} split 'train'" in str(w.message) for w in caught)


def test_config_problems_of_the_dataset_keys_are_reported_together(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config("quickstart", [f"data.dataset_name={tmp_path}", "data.validation_split=train"])
    text = str(info.value)
    assert "data.task / data.path / data.dataset_name: set exactly one (got ['task', 'dataset_name'])" in text
    assert "data.validation_split='train': the same split as data.split" in text
    problems = DataParams(task="arithmetic", validation_split="test").problems()
    assert problems == ["data.validation_split: only read with data.dataset_name (a dataset's split)"]
    assert "no such folder './nowhere'" in DataParams(dataset_name="./nowhere").problems()[0]


def test_prompt_columns_are_checked_for_text_without_reading_every_row():
    """Arrow's type and null count decide for a text column; a null or another type is found by row, and a
    null in a row that a selection left out is no error."""
    from rlkit.data.named import map_columns

    with_null = Dataset.from_dict({"q": ["a", None, "c"]})
    with pytest.raises(DataError, match=r"data.prompt_key='q': here row 1: the prompt is None, not text"):
        map_columns(with_null, "q", None, "here")
    assert map_columns(with_null.select([0, 2]), "q", None, "here")["prompt"] == ["a", "c"]
    with pytest.raises(DataError, match=r"here line 1: the prompt is 7, not text"):
        map_columns(Dataset.from_dict({"q": [7, 8]}), "q", None, "here", ["line 1", "line 2"])
    assert map_columns(Dataset.from_dict({"q": ["a", "b"]}), "q", None, "here")["prompt"] == ["a", "b"]
