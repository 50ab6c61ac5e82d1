"""Reading a user's prompt file (JSONL, JSON, parquet) with errors that name the file, the row and the fix.

Why rlkit reads JSON itself instead of ``datasets``' JSON builder: the builder reports a non-UTF-8 byte as a
bare ``UnicodeDecodeError`` and a bad line as a ``DatasetGenerationError`` about "generating the dataset",
neither naming the file. Parsing line by line costs about the same for prompt files and knows the line of
each row, which later checks (an over-long prompt) use to name it. Parquet is read by ``datasets`` after its
footer is checked with pyarrow (cheap: metadata only), so a truncated or empty file is named up front.

Every problem is a :class:`rlkit.errors.DataError` (a ``ConfigError``) whose text starts with the config key
that named the file (``data.path`` or ``data.validation_path``).

Deliberate simplifications: a ``.json`` file is a JSON array of row objects, an object of equal-length
columns, or JSON lines; no nested ``field`` selection.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datasets import Dataset
import pyarrow as pa
import pyarrow.parquet as pq

from rlkit.errors import DataError

JSON_SUFFIXES = (".jsonl", ".json")
PARQUET_SUFFIXES = (".parquet",)


@dataclass(frozen=True)
class PromptFile:
    """A file's rows and where each row came from."""

    dataset: Dataset
    labels: tuple[str, ...]  # [rows] "line 7" (JSON lines) or "row 6" (0-based), for messages

    def select(self, indices: list[int]) -> "PromptFile":
        return PromptFile(self.dataset.select(indices), tuple(self.labels[i] for i in indices))


def read_prompt_file(path: str, key: str) -> PromptFile:
    """The rows of ``path`` (``key`` is the config key that named it); :func:`rlkit.data.named.map_columns`
    then finds and checks their prompts."""
    file = Path(path)
    if file.stat().st_size == 0:
        raise DataError([f"{key}: {path!r} is empty; it needs one row per prompt"])
    if file.suffix.lower() in PARQUET_SUFFIXES:
        dataset = _read_parquet(path, key)
        labels = tuple(f"row {i}" for i in range(len(dataset)))
    else:
        rows, labels = _read_json_rows(file, key)
        dataset = _dataset_from_rows(rows, labels, path, key)
    return PromptFile(dataset, labels)


def _read_parquet(path: str, key: str) -> Dataset:
    try:
        rows = pq.ParquetFile(path).metadata.num_rows
    except (pa.ArrowException, OSError) as exc:
        raise DataError([f"{key}: {path!r} is not a readable parquet file ({exc}); it may be truncated. Fix: "
                         "write it again (e.g. Dataset.to_parquet or DataFrame.to_parquet)"]) from None
    if rows == 0:
        raise DataError([f"{key}: {path!r} is a parquet file with no rows; it needs one row per prompt"])
    try:
        return Dataset.from_parquet(path, keep_in_memory=True)
    except Exception as exc:  # noqa: BLE001 - a damaged row group; the footer was fine
        raise DataError([f"{key}: {path!r} could not be read as parquet ({type(exc).__name__}: {exc}). Fix: "
                         "write it again"]) from None


def _decode(file: Path, key: str) -> str:
    data = file.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DataError([f"{key}: {str(file)!r} is not UTF-8 text (line {line}, byte {exc.start}: {exc.reason}). "
                         "Fix: save it as UTF-8 (e.g. `iconv -f latin1 -t utf-8 in.jsonl > out.jsonl`)"]) from None


def _read_json_rows(file: Path, key: str) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    text = _decode(file, key)
    if file.suffix.lower() == ".json":
        try:
            whole = json.loads(text)
        except json.JSONDecodeError:
            whole = None  # not one JSON document: read it as JSON lines
        if isinstance(whole, list):
            return _objects(whole, [f"row {i}" for i in range(len(whole))], file, key)
        if isinstance(whole, dict) and whole and all(isinstance(v, list) for v in whole.values()):
            n = len(next(iter(whole.values())))
            if any(len(v) != n for v in whole.values()):
                raise DataError([f"{key}: {str(file)!r} holds columns of different lengths "
                                 f"{ {k: len(v) for k, v in whole.items()} }. Fix: give every column one value per row"])
            return [{k: v[i] for k, v in whole.items()} for i in range(n)], tuple(f"row {i}" for i in range(n))
    rows, labels = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise DataError([f"{key}: {str(file)!r} line {number} is not valid JSON ({exc.msg}, column {exc.colno}). "
                             "Fix: repair that line; each line holds one JSON object"]) from None
        labels.append(f"line {number}")
    return _objects(rows, labels, file, key)


def _objects(rows: list, labels: list[str], file: Path, key: str) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    if not rows:
        raise DataError([f"{key}: {str(file)!r} holds no rows; it needs one JSON object per prompt"])
    for row, label in zip(rows, labels):
        if not isinstance(row, dict):
            raise DataError([f"{key}: {str(file)!r} {label} is a JSON {type(row).__name__}, not an object. Fix: "
                             'write each row as an object, e.g. {"prompt": "2+3=", "answer": "5"}'])
    return rows, tuple(labels)


def _dataset_from_rows(rows: list[dict[str, Any]], labels: tuple[str, ...], path: str, key: str) -> Dataset:
    columns = list(dict.fromkeys(k for row in rows for k in row))  # every key of every row, in order seen
    try:
        return Dataset.from_dict({c: [row.get(c) for row in rows] for c in columns})
    except (TypeError, ValueError) as exc:  # pyarrow's ArrowInvalid / ArrowTypeError subclass these
        raise DataError([f"{key}: {path!r}: {_mixed_column(rows, labels, columns) or exc}. Fix: give each column "
                         "one type in every row (e.g. quote numbers that are text)"]) from None


def _mixed_column(rows: list[dict[str, Any]], labels: tuple[str, ...], columns: list[str]) -> str:
    """'column 'answer' is int on line 1 but str on line 2', for the first column whose types differ."""
    kind = lambda v: "number" if isinstance(v, (int, float)) and not isinstance(v, bool) else type(v).__name__  # noqa: E731
    for column in columns:
        first = None
        for row, label in zip(rows, labels):
            value = row.get(column)
            if value is None:
                continue
            if first is None:
                first = (kind(value), label)
            elif kind(value) != first[0]:
                return f"column {column!r} is {first[0]} on {first[1]} but {kind(value)} on {label}"
    return ""
