"""Prompt data by name, through ``datasets.load_dataset``: what a researcher already has.

``data.dataset_name`` is whatever ``load_dataset`` takes: a hub id (``openai/gsm8k``, with
``data.dataset_config=main``) when the machine is online or the dataset is in the local cache, or offline a
local folder of parquet/JSONL files (``train.jsonl`` / ``test.parquet`` name their splits) or a cloned dataset
repository. A folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` is read with
``load_from_disk`` (``load_dataset`` refuses those); a single saved ``Dataset`` is the split ``train``.

The split ``data.split`` becomes train; validation is ``data.validation_split`` or, without one, a
``data.validation_fraction`` of train's distinct prompts (:mod:`rlkit.data.prompts`). Columns are mapped to
the names the rest of rlkit reads: ``data.prompt_key`` -> ``prompt``, ``data.answer_key`` -> ``answer``
(the environments and the SFT warm start read ``row["answer"]``). ``data.answer_format=gsm8k`` keeps only
the final answer of a GSM8K solution (the text after its last ``####``), which is what math-verify compares.

Every problem (a split that does not exist or is empty, a missing column, a prompt that is not text, a
dataset that does not load) is one :class:`rlkit.errors.DataError` naming the config key, the split or column,
what the dataset does have, and the fix.

Deliberate simplifications: no streaming (the splits are read whole); one text prompt column, not a message
list. A wrong or empty split is recognised by the text of ``datasets``' own ``ValueError``; should that text
change, the problem is still reported, as a dataset that did not load.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Literal, Optional, Sequence

from datasets import Dataset, DatasetDict, load_dataset, load_from_disk

from rlkit.data.files import PromptFile
from rlkit.errors import DataError

AnswerFormat = Literal["plain", "gsm8k"]


def load_named_splits(p: Any) -> dict[str, PromptFile]:
    """Split name -> rows, for ``p.split`` and (if set) ``p.validation_split`` of ``p.dataset_name``
    (``p`` is :class:`rlkit.data.DataParams`), with the prompt and answer columns mapped."""
    wanted = {"data.split": p.split}
    if p.validation_split is not None:
        wanted["data.validation_split"] = p.validation_split
    splits, problems = _load(p.dataset_name, p.dataset_config, wanted)
    out = {}
    for key, name in wanted.items():
        if name in splits and len(splits[name]) == 0:
            problems.append(_empty(key, name, p.dataset_name))
        elif name in splits:  # columns are checked on every split that loaded, so one error says everything
            source = f"dataset {p.dataset_name!r} split {name!r}"
            try:
                dataset = map_answers(map_columns(splits[name], p.prompt_key, p.answer_key, source),
                                      p.answer_format, source)
            except DataError as error:
                problems += [q for q in error.problems if q not in problems]
                continue
            out[name] = PromptFile(dataset, tuple(f"row {i}" for i in range(len(dataset))))
    if problems:
        raise DataError(problems)
    return out


def _missing(key: str, split: str, name: str, known: str) -> str:
    return (f"{key}={split!r}: dataset {name!r} has no split {split!r}; its splits are {known}. "
            f"Fix: set {key} to one of them")


def _empty(key: str, split: str, name: str) -> str:
    return f"{key}={split!r}: split {split!r} of dataset {name!r} is empty (no rows). Fix: choose a split with rows"


_UNKNOWN_SPLIT = re.compile(r'Unknown split "(?P<split>.*)"\. Should be one of (?P<known>\[.*\])')


def _load(name: str, config: Optional[str], wanted: dict[str, str]) -> tuple[dict[str, Dataset], list[str]]:
    """The wanted splits that loaded, and a problem for each that does not exist or holds no rows.

    ``load_dataset`` is asked for one split at a time: asked for all of them, one empty split file fails the
    whole load ("Instruction 'test' corresponds to no data"), even when that split is not used."""
    folder = Path(name).expanduser()
    splits, problems = {}, []
    try:
        if folder.is_dir() and any((folder / f).is_file() for f in ("dataset_dict.json", "state.json")):
            saved = load_from_disk(str(folder))
            saved = saved if isinstance(saved, DatasetDict) else DatasetDict(train=saved)
            for key, split in wanted.items():
                if split in saved:
                    splits[split] = saved[split]
                else:
                    problems.append(_missing(key, split, name, str(sorted(saved))))
            return splits, problems
        for key, split in wanted.items():
            try:
                splits[split] = load_dataset(name, config, split=split)
            except ValueError as exc:
                if (unknown := _UNKNOWN_SPLIT.match(str(exc))) is not None:
                    problems.append(_missing(key, split, name, unknown.group("known")))
                elif "corresponds to no data" in str(exc):
                    problems.append(_empty(key, split, name))
                else:
                    raise
    except Exception as exc:  # noqa: BLE001 - datasets raises many types; each becomes one message naming the key
        raise DataError([f"data.dataset_name={name!r}: datasets.load_dataset could not load it "
                         f"({type(exc).__name__}: {(str(exc).strip().splitlines() or ['no message'])[0]}). "
                         f"Fix: {_load_fix(name, folder)}"]) from None
    return splits, problems


def _load_fix(name: str, folder: Path) -> str:
    if folder.is_dir():
        return ("give the folder parquet or JSONL files (train.jsonl, test.jsonl, ...), or write it with "
                "Dataset.save_to_disk; a dataset with several configurations also needs data.dataset_config")
    offline = any(os.environ.get(v, "0").lower() in ("1", "true", "yes")
                  for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
    where = ("the hub is off here (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE) and the dataset is not in the local cache; "
             if offline else "")
    return (f"{where}check the hub id and data.dataset_config, or on a machine that is online run "
            f"datasets.load_dataset({name!r}).save_to_disk('folder') and set data.dataset_name to that folder "
            "(or to a folder of parquet/JSONL files)")


def map_columns(dataset: Dataset, prompt_key: str, answer_key: Optional[str], source: str,
                labels: Optional[Sequence[str]] = None) -> Dataset:
    """``prompt_key`` renamed to ``prompt`` and ``answer_key`` (if set) to ``answer``; every prompt must be text.
    ``labels``: where each row came from (``"line 7"`` of a file), for the message; ``"row i"`` by default."""
    columns = dataset.column_names
    problems = []
    for key, column, target in (("data.prompt_key", prompt_key, "prompt"), ("data.answer_key", answer_key, "answer")):
        if column is None:
            continue
        if column not in columns:
            problems.append(f"{key}={column!r}: {source} has no column {column!r}; its columns are {columns}. "
                            f"Fix: set {key} to the column holding the {target}")
        elif column != target and target in columns:
            problems.append(f"{key}={column!r}: {source} has both {column!r} and {target!r}; the {target} column is "
                            f"renamed to {target!r}, so drop or rename one of them first")
    if problems:
        raise DataError(problems)
    dataset = dataset.rename_columns({c: t for c, t in ((prompt_key, "prompt"), (answer_key, "answer"))
                                      if c is not None and c != t})
    dataset = _answers_as_loaded(dataset)
    text = getattr(dataset.features["prompt"], "dtype", None) in ("string", "large_string")
    if text and not dataset.data.column("prompt").null_count:  # Arrow settles it unread, no Python loop
        return dataset
    bad = next((i for i, prompt in enumerate(dataset["prompt"]) if not isinstance(prompt, str)), None)
    if bad is not None:
        raise DataError([f"data.prompt_key={prompt_key!r}: {source} {labels[bad] if labels else f'row {bad}'}: the "
                         f"prompt is {dataset[bad]['prompt']!r}, not text. Fix: choose a text column (a message "
                         "list is not supported), or give every row a text prompt (quote numbers) or drop the row"])
    return dataset


def _answers_as_loaded(dataset: Dataset) -> Dataset:
    """An answer column of mixed types (``"007"`` on one row, ``12`` on another) as the text each row holds.

    Why: ``datasets``' JSON builder stores such a column as its ``Json`` feature, keeping each value's text as
    written but unquoted, and decodes that text back as JSON, so the string ``"007"`` comes back as the number 7
    (and ``"1e3"`` as 1000.0). Answers are compared as text by every environment, so the text is what counts:
    a value stored quoted (a string that needs quoting) is unquoted, every other one is kept as written."""
    if "answer" not in dataset.column_names or type(dataset.features["answer"]).__name__ != "Json":
        return dataset
    stored = [value for chunk in dataset.data.column("answer").chunks for value in chunk.storage.to_pylist()]
    return _with_answers(dataset, [json.loads(v) if isinstance(v, str) and v.startswith('"') else v for v in stored])


def map_answers(dataset: Dataset, answer_format: AnswerFormat, source: str) -> Dataset:
    """``plain``: answers as they are. ``gsm8k``: the text after the last ``####`` of each answer, thousands
    separators dropped (``"... #### 1,200"`` -> ``"1200"``)."""
    if answer_format == "plain":
        return dataset
    if "answer" not in dataset.column_names:
        raise DataError([f"data.answer_format={answer_format!r}: {source} has no 'answer' column; set data.answer_key "
                         "to the column holding the solutions"])
    bad = next((i for i, a in enumerate(dataset["answer"]) if not isinstance(a, str) or "####" not in a), None)
    if bad is not None:
        raise DataError([f"data.answer_format=gsm8k: {source} row {bad}: the answer {dataset[bad]['answer']!r} has no "
                         "'####' before its final answer. Fix: data.answer_format=plain, or clean that row"])
    return _with_answers(dataset, [a.rsplit("####", 1)[1].strip().replace(",", "") for a in dataset["answer"]])


def _with_answers(dataset: Dataset, answers: list[Any]) -> Dataset:
    """``dataset`` with its ``answer`` column replaced by ``answers``, in the same position."""
    position = dataset.column_names.index("answer")
    dataset = dataset.remove_columns("answer").add_column("answer", answers)
    return dataset.select_columns(dataset.column_names[:position] + ["answer"] + dataset.column_names[position:-1])
