"""Bad prompt files are DataErrors (ConfigErrors) naming the config key, the file, the line and the fix."""

import json

import pytest
from datasets import Dataset

from rlkit.data import load_prompt_dataset
from rlkit.errors import ConfigError, DataError


def only_problem(source):
    with pytest.raises(DataError) as info:
        load_prompt_dataset(source)
    (problem,) = info.value.problems
    return problem


def test_data_error_is_a_config_error():
    assert issubclass(DataError, ConfigError)


def test_non_utf8_jsonl_names_the_file_and_line(tmp_path):
    path = tmp_path / "latin.jsonl"
    path.write_bytes('{"prompt": "a"}\n{"prompt": "café"}\n'.encode("latin-1"))
    assert only_problem(str(path)).startswith(
        f"data.path: {str(path)!r} is not UTF-8 text (line 2, byte 31: invalid continuation byte). Fix: save it as UTF-8")


def test_bad_json_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a"}\n\n{"prompt": "b"\n')
    assert only_problem(str(path)).startswith(f"data.path: {str(path)!r} line 3 is not valid JSON (Expecting ',' delimiter")


@pytest.mark.parametrize("line, kind", [('["a"]', "list"), ("7", "int"), ('"a"', "str")])
def test_rows_that_are_not_objects(tmp_path, line, kind):
    path = tmp_path / "rows.jsonl"
    path.write_text(f'{{"prompt": "a"}}\n{line}\n')
    assert only_problem(str(path)).startswith(f"data.path: {str(path)!r} line 2 is a JSON {kind}, not an object")


def test_missing_prompt_and_mixed_types_name_the_row(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "a"}\n{"answer": "1"}\n')
    assert only_problem(str(path)).startswith(
        f"data.prompt_key='prompt': {str(path)!r} line 2: the prompt is None, not text. Fix:")
    path.write_text('{"prompt": "a", "answer": 1}\n{"prompt": "b", "answer": "x"}\n')
    assert only_problem(str(path)).startswith(
        f"data.path: {str(path)!r}: column 'answer' is number on line 1 but str on line 2. Fix:")


def test_blank_jsonl_has_no_rows(tmp_path):
    path = tmp_path / "blank.jsonl"
    path.write_text("\n\n")
    assert only_problem(str(path)) == f"data.path: {str(path)!r} holds no rows; it needs one JSON object per prompt"


def test_empty_and_truncated_parquet(tmp_path):
    empty = tmp_path / "empty.parquet"
    Dataset.from_dict({"prompt": []}).to_parquet(str(empty))  # a valid file with no rows
    assert only_problem(str(empty)) == f"data.path: {str(empty)!r} is a parquet file with no rows; it needs one row per prompt"
    good = tmp_path / "good.parquet"
    Dataset.from_dict({"prompt": ["a", "b"]}).to_parquet(str(good))
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(good.read_bytes()[:-20])
    assert only_problem(str(cut)).startswith(f"data.path: {str(cut)!r} is not a readable parquet file (")


def test_the_validation_file_is_named_by_its_key(tmp_path):
    train, val = tmp_path / "t.jsonl", tmp_path / "v.jsonl"
    train.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(3)))
    val.write_text('{"prompt": "v"\n')
    assert only_problem({"path": str(train), "validation_path": str(val)}).startswith(
        f"data.validation_path: {str(val)!r} line 1 is not valid JSON")


def test_json_array_and_columns_files_read(tmp_path):
    array, columns = tmp_path / "a.json", tmp_path / "c.json"
    array.write_text(json.dumps([{"prompt": f"p{i}", "answer": str(i)} for i in range(4)]))
    columns.write_text(json.dumps({"prompt": [f"p{i}" for i in range(4)], "answer": [str(i) for i in range(4)]}))
    for path in (array, columns):
        ds = load_prompt_dataset({"path": str(path), "validation_fraction": 0.25})
        assert sorted(list(ds["train"]["prompt"]) + list(ds["validation"]["prompt"])) == ["p0", "p1", "p2", "p3"]
        assert ds["train"].column_names == ["prompt", "answer"]


def test_rows_with_different_keys_keep_every_column(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": "b", "level": 2}\n{"prompt": "c"}\n{"prompt": "d"}\n')
    ds = load_prompt_dataset({"path": str(path), "validation_fraction": 0.25})
    assert set(ds["train"].column_names) == {"prompt", "level"}
