"""Prompt datasets: a generated task or a local file, as an HF ``DatasetDict`` with train and validation.

Two sources, one result (``DatasetDict`` with ``"train"`` and ``"validation"``, each with a ``"prompt"``
column plus whatever else the rows hold, e.g. ``"answer"``):

- a generated task (``DataParams(task="arithmetic", digits=3, ...)``), made in process from the seed, so the
  quickstart needs no download. Validation holds the first ``num_validation`` *distinct* prompts of the
  stream; train holds the next ``num_train`` rows whose prompt is not among them, so the splits are disjoint
  by construction (train may repeat a prompt, which matters only for tiny ``digits``);
- a local JSONL or parquet file (``DataParams(path=...)``), its prompt column named by ``prompt_key`` (renamed
  to ``"prompt"``), with validation either from ``validation_path`` or a ``validation_fraction`` of the
  file's distinct prompts, so that duplicated rows cannot leak a validation prompt into train.

``render_prompts`` applies the tokenizer's chat template, which is where the system prompt goes. Given the
tokenizer and the longest prompt a rollout can take, ``load_prompt_dataset`` drops (or refuses) prompts that
are too long when it loads them (:mod:`rlkit.data.lengths`); files are read by :mod:`rlkit.data.files`, whose
errors name the file and the row.

Deliberate simplifications: no remote datasets (``datasets.load_dataset("org/name")`` then
``Dataset.to_json`` gives a file this module reads); one prompt column of plain text, not a message list.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import random
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Optional, Union

from datasets import Dataset, DatasetDict

from rlkit.data.files import JSON_SUFFIXES, PARQUET_SUFFIXES, PromptFile, read_prompt_file
from rlkit.data.lengths import OverlongPrompts, overlong_rows
from rlkit.envs.arithmetic import count_arithmetic_prompts, iter_arithmetic_rows
from rlkit.errors import ConfigError, ModelError

Task = Literal["arithmetic"]
_SUFFIXES = JSON_SUFFIXES + PARQUET_SUFFIXES
Fit = Callable[[PromptFile, str], PromptFile]  # a file or split and its name -> the rows a rollout can take


@dataclass(frozen=True)
class DataParams:
    """Where prompts come from. Set ``task`` (generated) or ``path`` (a local file), not both."""

    __pydantic_config__ = {"extra": "forbid"}  # as a section of the run config: unknown keys are errors

    task: Optional[Task] = None  # generated in process
    digits: int = 3  # arithmetic: longest operand, the difficulty knob
    num_train: int = 1000  # generated train rows
    num_validation: int = 100  # generated validation rows (distinct prompts)
    path: Optional[str] = None  # local .jsonl / .json / .parquet file
    validation_path: Optional[str] = None  # a separate validation file; else validation_fraction of path
    prompt_key: str = "prompt"  # the file's prompt column
    validation_fraction: float = 0.1  # share of the file's distinct prompts held out for validation
    seed: int = 0
    system_prompt: Optional[str] = None  # passed to render_prompts by the rollout stage
    # prompts too long for a rollout (rendered, tokenized) at load time: drop them with a warning, or refuse
    overlong_prompts: OverlongPrompts = "filter"

    def problems(self) -> list[str]:
        """Every problem with these params, each with its dotted key, the reason and the fix."""
        out = []
        if (self.task is None) == (self.path is None):
            out.append("data.task / data.path: set exactly one: task='arithmetic' to generate prompts, "
                       "or path='file.jsonl' to read them")
        if self.task is not None and self.task != "arithmetic":
            out.append(f"data.task: unknown task {self.task!r}; the generated task is 'arithmetic'")
        if self.task is not None:
            if not isinstance(self.digits, int) or self.digits < 1:
                out.append(f"data.digits: must be an integer >= 1, got {self.digits!r}")
            elif self.num_validation >= count_arithmetic_prompts(self.digits):
                out.append(f"data.num_validation: {self.num_validation} distinct prompts requested but digits="
                           f"{self.digits} allows only {count_arithmetic_prompts(self.digits)}, leaving none for "
                           "train; raise data.digits or lower data.num_validation")
            for key in ("num_train", "num_validation"):
                if getattr(self, key) < 1:
                    out.append(f"data.{key}: must be >= 1 (an empty split cannot be sampled), got {getattr(self, key)}")
        if self.overlong_prompts not in ("filter", "error"):
            out.append(f"data.overlong_prompts: must be 'filter' (drop with a warning) or 'error', got "
                       f"{self.overlong_prompts!r}")
        if self.path is not None and self.validation_path is None and not 0 < self.validation_fraction < 1:
            out.append(f"data.validation_fraction: must be in (0, 1), got {self.validation_fraction}; "
                       "or set data.validation_path")
        for key in ("path", "validation_path"):
            value = getattr(self, key)
            if value is not None and Path(value).suffix.lower() not in _SUFFIXES:
                out.append(f"data.{key}: {value!r} is not a .jsonl, .json or .parquet file")
            elif value is not None and not Path(value).is_file():
                out.append(f"data.{key}: no such file {value!r}; check the path (relative paths start at "
                           f"{Path.cwd()})")
        return out

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "DataParams":
        """``DataParams(**values)``, with unknown keys reported with the nearest known key."""
        known = [f.name for f in dataclasses.fields(cls)]
        problems = []
        for key in values:
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                problems.append(f"data.{key}: unknown key" + (f"; did you mean {close[0]!r}?" if close else
                                                              f"; known keys: {', '.join(known)}"))
        if problems:
            raise ConfigError(problems)
        return cls(**values)


def load_prompt_dataset(source: Union[DataParams, Mapping[str, Any], str, Path], tokenizer: Any = None,
                        max_prompt_tokens: Optional[int] = None) -> DatasetDict:
    """Train and validation prompts from ``source``: ``DataParams``, a mapping of its fields, or a file path.

    With ``tokenizer`` and ``max_prompt_tokens`` (``PolicyConfig.max_prompt_tokens``), prompts longer than a
    rollout can take are dropped with a warning or refused, as ``data.overlong_prompts`` says.
    """
    if (tokenizer is None) != (max_prompt_tokens is None):
        raise ValueError("load_prompt_dataset: pass both tokenizer and max_prompt_tokens, or neither")
    if isinstance(source, (str, Path)):
        params = DataParams(path=str(source))
    elif isinstance(source, DataParams):
        params = source
    else:
        params = DataParams.from_mapping(source)
    problems = params.problems()
    if problems:
        raise ConfigError(problems)
    fit = _length_fit(params, tokenizer, max_prompt_tokens)
    splits = _generate(params, fit) if params.task is not None else _from_files(params, fit)
    fixes = {
        "train": "add rows to the file, or lower data.validation_fraction",
        "validation": "give data.validation_path rows, or raise data.validation_fraction",
    }
    for name, split in splits.items():
        if len(split) == 0:
            raise ConfigError([f"data: the {name} split is empty; {fixes[name]}"])
    return splits


def _length_fit(p: DataParams, tokenizer: Any, max_prompt_tokens: Optional[int]) -> Fit:
    """The rows of a file or split that a rollout can take (all of them without a tokenizer)."""

    def fit(file: PromptFile, source: str) -> PromptFile:
        if tokenizer is None:
            return file
        keep = overlong_rows(file.dataset["prompt"], file.labels, source, tokenizer, max_prompt_tokens,
                             p.system_prompt, p.overlong_prompts)
        return file if len(keep) == len(file.labels) else file.select(keep)

    return fit


def _generate(p: DataParams, fit: Fit) -> DatasetDict:
    stream = iter_arithmetic_rows(p.digits, p.seed)
    validation: list[dict[str, str]] = []
    seen: set[str] = set()
    while len(validation) < p.num_validation:
        row = next(stream)
        if row["prompt"] not in seen:
            seen.add(row["prompt"])
            validation.append(row)
    train = list(itertools.islice((r for r in stream if r["prompt"] not in seen), p.num_train))
    splits = {"train": train, "validation": validation}
    return DatasetDict({
        name: fit(PromptFile(Dataset.from_list(rows), tuple(f"row {i}" for i in range(len(rows)))),
                  f"the generated {name} split").dataset
        for name, rows in splits.items()
    })


def _from_files(p: DataParams, fit: Fit) -> DatasetDict:
    train = fit(read_prompt_file(p.path, p.prompt_key, "data.path"), repr(p.path)).dataset
    if p.validation_path is not None:
        validation = fit(read_prompt_file(p.validation_path, p.prompt_key, "data.validation_path"),
                         repr(p.validation_path)).dataset
        overlap = set(train["prompt"]) & set(validation["prompt"])
        if overlap:
            warnings.warn(f"{len(overlap)} validation prompt(s) also appear in the train file {p.path!r}; "
                          "validation scores will be optimistic", stacklevel=3)
        return DatasetDict(train=train, validation=validation)
    prompts = list(dict.fromkeys(train["prompt"]))  # distinct, in file order
    random.Random(p.seed).shuffle(prompts)
    held_out = set(prompts[: round(len(prompts) * p.validation_fraction)])
    in_validation = [prompt in held_out for prompt in train["prompt"]]
    return DatasetDict(
        train=train.select([i for i, v in enumerate(in_validation) if not v]),
        validation=train.select([i for i, v in enumerate(in_validation) if v]),
    )


def render_prompt_texts(tokenizer: Any, prompts: list[str], system_prompt: Optional[str] = None) -> list[str]:
    """Each prompt as a user turn (after an optional system turn) rendered by the chat template."""
    if not getattr(tokenizer, "chat_template", None):
        raise ModelError(
            f"the tokenizer {type(tokenizer).__name__} has no chat template, so prompts cannot be rendered as "
            "chat turns; set tokenizer.chat_template to a Jinja template, or use a model folder made by "
            "`rlkit make-model` (its tokenizer ships one)"
        )
    head = [{"role": "system", "content": system_prompt}] if system_prompt is not None else []
    return [
        tokenizer.apply_chat_template(
            head + [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
        )
        for p in prompts
    ]


def render_prompts(tokenizer: Any, prompts: list[str], system_prompt: Optional[str] = None) -> list[list[int]]:
    """Token ids of each rendered prompt, ending with the assistant header so generation starts the reply.

    The template already writes any BOS, so the text is encoded with ``add_special_tokens=False``.
    """
    texts = render_prompt_texts(tokenizer, prompts, system_prompt)
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
