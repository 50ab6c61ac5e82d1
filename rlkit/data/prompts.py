"""Prompt datasets: a generated task, a local file or a dataset by name, as an HF ``DatasetDict``.

Three sources, one result (``DatasetDict`` with ``"train"`` and ``"validation"``, each with a ``"prompt"``
column plus whatever else the rows hold, e.g. ``"answer"``):

- a generated task (``DataParams(task="arithmetic", digits=3, ...)``), made in process from the seed, so the
  quickstart needs no download. Validation holds the first ``num_validation`` *distinct* prompts of the
  stream; train holds the next ``num_train`` rows whose prompt is not among them, so the splits are disjoint
  by construction (train may repeat a prompt, which matters only for tiny ``digits``). A reasoning-gym task
  (``task="reasoning_gym:chain_sum"``, its generator's keys in ``task_config``) is made the same way by
  :mod:`rlkit.data.reasoning_gym`;
- a local JSONL or parquet file (``DataParams(path=...)``), its prompt column named by ``prompt_key`` (renamed
  to ``"prompt"``), with validation either from ``validation_path`` or a ``validation_fraction`` of the
  file's distinct prompts, so that duplicated rows cannot leak a validation prompt into train;
- a dataset by name (``DataParams(dataset_name="openai/gsm8k", dataset_config="main", prompt_key="question")``)
  through ``datasets.load_dataset``: a hub id online, a local folder of parquet/JSONL files offline
  (:mod:`rlkit.data.named`); train is ``split``, validation is ``validation_split`` or a
  ``validation_fraction`` of train's distinct prompts, as for a file.

``data.prompt_template`` (``"What is {prompt}? Answer with just the number."``) puts every row's prompt, from any
source, into one text as it loads (:mod:`rlkit.data.templates`), before the length filter; the generated arithmetic
task draws its operation from ``data.operations``.

``render_prompts`` applies the tokenizer's chat template, which is where the system prompt goes. Given the
tokenizer and the longest prompt a rollout can take, ``load_prompt_dataset`` drops (or refuses) prompts that
are too long when it loads them (:mod:`rlkit.data.lengths`); files are read by :mod:`rlkit.data.files`, whose
errors name the file and the row.

Deliberate simplifications: one prompt column of plain text, not a message list.
"""

from __future__ import annotations

import difflib
import itertools
import random
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Mapping, Optional, Sequence, Union, get_args

from datasets import Dataset, DatasetDict
from pydantic import StringConstraints, TypeAdapter, ValidationError, WrapValidator
from pydantic_core import PydanticCustomError

from rlkit.data.files import JSON_SUFFIXES, PARQUET_SUFFIXES, PromptFile, read_prompt_file
from rlkit.data.lengths import OverlongPrompts, empty_rows, overlong_rows
from rlkit.data.named import AnswerFormat, load_named_splits, map_answers, map_columns
from rlkit.data.reasoning_gym import (
    is_reasoning_gym_task,
    reasoning_gym_problems,
    reasoning_gym_splits,
    reasoning_gym_tasks,
    suggest_reasoning_gym_task,
)
from rlkit.data.templates import apply_template, template_problems
from rlkit.envs.arithmetic import OPERATIONS, Operation, count_arithmetic_prompts, iter_arithmetic_rows
from rlkit.envs.tool_arithmetic import iter_native_tool_arithmetic_rows, iter_tool_arithmetic_rows
from rlkit.errors import ConfigError, describe_invalid

# rlkit's generated tasks, each with its line for `rlkit tasks` (tool_*: rows with a tool demonstration)
TASK_DESCRIPTIONS = {
    "arithmetic": "a+b (or -, *: data.operations) with operands of up to data.digits digits; the answer is the value",
    "tool_arithmetic": "arithmetic with a <calc> calculator call (two turns); rows carry SFT demonstrations",
    "tool_arithmetic_native": "tool_arithmetic with a native JSON tool, add(a, b), rendered by the chat template",
}
Task = Literal[tuple(TASK_DESCRIPTIONS)]  # type: ignore[valid-type]
ReasoningGymTask = Annotated[str, StringConstraints(pattern=r"^reasoning_gym:")]  # "reasoning_gym:<name>"


def _unknown_task(task: Any) -> str:
    own = difflib.get_close_matches(task, get_args(Task), n=1) if isinstance(task, str) else []
    return (f"unknown task {task!r}; rlkit's generated tasks are {', '.join(map(repr, get_args(Task)))}, and "
            "reasoning-gym's are named 'reasoning_gym:<name>' (`rlkit tasks` lists them)"
            + (f"; did you mean {own[0]!r}?" if own else suggest_reasoning_gym_task(task)))


def _one_task_problem(value: Any, handler: Any) -> Any:
    """One problem for a task that is neither of the union's kinds, not one per kind."""
    try:
        return handler(value)
    except ValidationError:
        raise PydanticCustomError("unknown_task", _unknown_task(value)) from None


TaskName = Annotated[Union[Task, ReasoningGymTask], WrapValidator(_one_task_problem)]
_SUFFIXES = JSON_SUFFIXES + PARQUET_SUFFIXES
Fit = Callable[[PromptFile, str], PromptFile]  # a file or split and its name -> the rows a rollout can take


def generated_tasks() -> list[tuple[str, str]]:
    """``(data.task value, one-line description)`` of every generated task: rlkit's, then reasoning-gym's
    (``reasoning_gym:<name>``; :class:`rlkit.envs.reasoning_gym.ReasoningGymMissing` when it is not installed)."""
    return list(TASK_DESCRIPTIONS.items()) + reasoning_gym_tasks()


@dataclass(frozen=True)
class DataParams:
    """Where prompts come from. Set one of ``task`` (generated), ``path`` (a local file) or ``dataset_name``."""

    __pydantic_config__ = {"extra": "forbid"}  # as a section of the run config: unknown keys are errors

    # generated in process: rlkit's tasks, or reasoning-gym's by name, "reasoning_gym:chain_sum" (`rlkit tasks`
    # lists them; "reasoning_gym:composite" is a weighted mix), scored by env.name=reasoning_gym
    task: Optional[TaskName] = None
    digits: int = 3  # arithmetic: longest operand, the difficulty knob
    # arithmetic and tool_arithmetic: the operations drawn, uniformly, e.g. ["+", "-", "*"] ("-" can give negative
    # answers); tool_arithmetic_native's add tool takes "+" only
    operations: tuple[Operation, ...] = ("+",)
    # reasoning_gym tasks: the generator's keys, e.g. {min_digits: 1, max_digits: 2} for chain_sum; the composite's
    # {datasets: [{name: chain_sum, weight: 2, config: {...}}, {name: leg_counting, weight: 1}]}
    task_config: dict[str, Any] = field(default_factory=dict)
    num_train: int = 1000  # generated train rows
    num_validation: int = 100  # generated validation rows (distinct prompts)
    path: Optional[str] = None  # local .jsonl / .json / .parquet file
    validation_path: Optional[str] = None  # a separate validation file; else validation_fraction of path
    prompt_key: str = "prompt"  # the file's or dataset's prompt column (renamed to "prompt")
    answer_key: Optional[str] = None  # its answer column, renamed to "answer" (what envs and SFT read); None: as is
    answer_format: AnswerFormat = "plain"  # gsm8k: keep the text after the last '####' of each answer
    dataset_name: Optional[str] = None  # datasets.load_dataset: a hub id, or a local folder of parquet/JSONL files
    dataset_config: Optional[str] = None  # the dataset's configuration (load_dataset's name, e.g. "main" for gsm8k)
    split: str = "train"  # the dataset's split the train prompts come from
    validation_split: Optional[str] = None  # the dataset's held-out split; else validation_fraction of split
    validation_fraction: float = 0.1  # share of the file's distinct prompts held out for validation
    seed: int = 0
    system_prompt: Optional[str] = None  # passed to render_prompts by the rollout stage
    # every row's prompt (any source) put into this text at load time, where {prompt} stands, e.g. "What is
    # {prompt}? Answer with just the number."; rollouts, SFT, evaluation and the length filter see the result
    prompt_template: Optional[str] = None
    # keyword arguments of every apply_chat_template call (rollouts, SFT, evaluation, the length filter), e.g.
    # {enable_thinking: false} for Qwen3's template
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    # prompts too long for a rollout (rendered, tokenized) at load time: drop them with a warning, or refuse
    overlong_prompts: OverlongPrompts = "filter"

    def problems(self) -> list[str]:
        """Every problem with these params, each with its dotted key, the reason and the fix."""
        out = []
        sources = [k for k in ("task", "path", "dataset_name") if getattr(self, k) is not None]
        if len(sources) != 1:
            out.append(f"data.task / data.path / data.dataset_name: set exactly one (got {sources or 'none'}): "
                       "task='arithmetic' to generate prompts, path='file.jsonl' to read a file, or "
                       "dataset_name='org/name' (or a local folder) to load a dataset")
        out += self._dataset_problems()
        if self.task is not None and not is_reasoning_gym_task(self.task) and self.task not in get_args(Task):
            out.append(f"data.task: {_unknown_task(self.task)}")
        if is_reasoning_gym_task(self.task):
            out += reasoning_gym_problems(self.task, self.task_config)
        elif self.task_config:
            out.append("data.task_config: only read with data.task=reasoning_gym:<name> (the generator's keys); "
                       "remove it, or name a reasoning-gym task")
        if self.task is not None and not is_reasoning_gym_task(self.task):
            ops = self._operation_problems()
            out += ops
            if not isinstance(self.digits, int) or self.digits < 1:
                out.append(f"data.digits: must be an integer >= 1, got {self.digits!r}")
            elif not ops and self.num_validation >= count_arithmetic_prompts(self.digits, self.operations):
                count = count_arithmetic_prompts(self.digits, self.operations)
                out.append(f"data.num_validation: {self.num_validation} distinct prompts requested but digits="
                           f"{self.digits} with operations {list(self.operations)} allows only {count}, leaving none "
                           "for train; raise data.digits, add data.operations or lower data.num_validation")
        elif tuple(self.operations) != ("+",):
            out.append("data.operations: only read by data.task=arithmetic or tool_arithmetic (the generated "
                       "arithmetic rows); remove it, or set data.task")
        out += template_problems(self.prompt_template)
        if self.task is not None:
            for key in ("num_train", "num_validation"):
                if getattr(self, key) < 1:
                    out.append(f"data.{key}: must be >= 1 (an empty split cannot be sampled), got {getattr(self, key)}")
        if self.overlong_prompts not in ("filter", "error"):
            out.append(f"data.overlong_prompts: must be 'filter' (drop with a warning) or 'error', got "
                       f"{self.overlong_prompts!r}")
        held_out = self.validation_path if self.path is not None else self.validation_split
        if self.task is None and held_out is None and not 0 < self.validation_fraction < 1:
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

    def _operation_problems(self) -> list[str]:
        ops = self.operations
        if isinstance(ops, str) or not isinstance(ops, Sequence) or not ops or any(op not in OPERATIONS for op in ops):
            return [f"data.operations: must be a non-empty list of {', '.join(map(repr, OPERATIONS))}, got {ops!r}; "
                    "e.g. data.operations=[+,-]"]
        if self.task == "tool_arithmetic_native" and tuple(ops) != ("+",):
            return [f"data.operations={list(ops)}: tool_arithmetic_native's native tool is add(a, b), so its rows are "
                    "sums only; use data.task=tool_arithmetic (a calculator) for other operations, or remove "
                    "data.operations"]
        return []

    def _dataset_problems(self) -> list[str]:
        """Keys that only ``dataset_name`` reads, and a name that is plainly a local path that is not there."""
        if self.dataset_name is None:
            return [f"data.{k}: only read with data.dataset_name (a dataset's split)"
                    for k in ("validation_split", "dataset_config") if getattr(self, k) is not None]
        out = []
        if self.validation_path is not None:
            out.append("data.validation_path: a file's held-out prompts; with data.dataset_name use "
                       "data.validation_split")
        if self.validation_split == self.split:
            out.append(f"data.validation_split={self.split!r}: the same split as data.split would validate on the "
                       "training prompts; name another split, or leave it unset to hold out data.validation_fraction")
        name = self.dataset_name
        if name.startswith((".", "/", "~")) and not Path(name).expanduser().exists():
            out.append(f"data.dataset_name: no such folder {name!r} (relative paths start at {Path.cwd()})")
        return out

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "DataParams":
        """``values`` validated as the run config's ``data`` section: unknown keys (with the nearest known key)
        and wrong types are reported together, by dotted key."""
        try:
            return TypeAdapter(cls).validate_python(dict(values))
        except ValidationError as e:
            raise ConfigError([describe_invalid(error, ("data",), cls) for error in e.errors()]) from None


def load_prompt_dataset(source: Union[DataParams, Mapping[str, Any], str, Path], tokenizer: Any = None,
                        max_prompt_tokens: Optional[int] = None,
                        tools: Optional[Sequence[Mapping[str, Any]]] = None) -> DatasetDict:
    """Train and validation prompts from ``source``: ``DataParams``, a mapping of its fields, or a file path.

    With ``tokenizer`` and ``max_prompt_tokens`` (``PolicyConfig.max_prompt_tokens``), prompts longer than a
    rollout can take are dropped with a warning or refused, as ``data.overlong_prompts`` says; a prompt's length
    counts the JSON ``tools`` the rollout renders into it (a native-tool environment's).
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
    fit = _length_fit(params, tokenizer, max_prompt_tokens, tools)
    if params.task is not None:
        splits = _generate(params, fit)
    else:
        splits = _from_files(params, fit) if params.path is not None else _from_dataset(params, fit)
    fixes = {
        "train": "add rows to the file (or the dataset's data.split), or lower data.validation_fraction",
        "validation": "give data.validation_path (or data.validation_split) rows, or raise data.validation_fraction",
    }
    for name, split in splits.items():
        if len(split) == 0:
            raise ConfigError([f"data: the {name} split is empty; {fixes[name]}"])
    return splits


def _length_fit(p: DataParams, tokenizer: Any, max_prompt_tokens: Optional[int],
                tools: Optional[Sequence[Mapping[str, Any]]] = None) -> Fit:
    """The rows of a file or split that a rollout can take: not empty, templated (``data.prompt_template``) and,
    given a tokenizer, not over-long."""

    def fit(file: PromptFile, source: str) -> PromptFile:
        keep = empty_rows(file.dataset.with_format("arrow")["prompt"], file.labels, source)  # before the template
        file = file if len(keep) == len(file.labels) else file.select(keep)
        file = PromptFile(apply_template(file.dataset, p.prompt_template), file.labels)
        if tokenizer is not None:
            keep = overlong_rows(list(file.dataset["prompt"]), file.labels, source, tokenizer, max_prompt_tokens,
                                 p.system_prompt, p.overlong_prompts, p.chat_template_kwargs, tools)
            file = file if len(keep) == len(file.labels) else file.select(keep)
        return file

    return fit


def _generate(p: DataParams, fit: Fit) -> DatasetDict:
    if is_reasoning_gym_task(p.task):
        splits = reasoning_gym_splits(p.task, p.task_config, p.seed, p.num_train, p.num_validation, p.system_prompt)
    else:
        splits = _arithmetic_splits(p)
    return DatasetDict({
        name: fit(PromptFile(Dataset.from_list(rows), tuple(f"row {i}" for i in range(len(rows)))),
                  f"the generated {name} split").dataset
        for name, rows in splits.items()
    })


def _arithmetic_splits(p: DataParams) -> dict[str, list[dict[str, str]]]:
    if p.task == "tool_arithmetic_native":  # sums only: its add tool (DataParams.problems)
        stream = iter_native_tool_arithmetic_rows(p.digits, p.seed)
    else:
        rows = iter_tool_arithmetic_rows if p.task == "tool_arithmetic" else iter_arithmetic_rows
        stream = rows(p.digits, p.seed, tuple(p.operations))
    validation: dict[str, dict[str, str]] = {}  # prompt -> its first row
    while len(validation) < p.num_validation:
        row = next(stream)
        validation.setdefault(row["prompt"], row)
    train = list(itertools.islice((r for r in stream if r["prompt"] not in validation), p.num_train))
    return {"train": train, "validation": list(validation.values())}


def _from_files(p: DataParams, fit: Fit) -> DatasetDict:
    def read(path: str, key: str) -> Dataset:
        file = read_prompt_file(path, key)
        data = map_columns(file.dataset, p.prompt_key, p.answer_key, repr(path), file.labels)
        data = map_answers(data, p.answer_format, repr(path))
        return fit(PromptFile(data, file.labels), repr(path)).dataset

    train = read(p.path, "data.path")
    if p.validation_path is None:
        return _hold_out(train, p)
    return _with_validation(train, read(p.validation_path, "data.validation_path"), f"the train file {p.path!r}")


def _from_dataset(p: DataParams, fit: Fit) -> DatasetDict:
    splits = load_named_splits(p)
    source = lambda split: f"dataset {p.dataset_name!r} split {split!r}"  # noqa: E731
    train = fit(splits[p.split], source(p.split)).dataset
    if p.validation_split is None:
        return _hold_out(train, p)
    return _with_validation(train, fit(splits[p.validation_split], source(p.validation_split)).dataset,
                            source(p.split))


def _with_validation(train: Dataset, validation: Dataset, train_source: str) -> DatasetDict:
    overlap = set(train["prompt"]) & set(validation["prompt"])
    if overlap:
        warnings.warn(f"{len(overlap)} validation prompt(s) also appear in {train_source}; "
                      "validation scores will be optimistic", stacklevel=4)
    return DatasetDict(train=train, validation=validation)


def _hold_out(train: Dataset, p: DataParams) -> DatasetDict:
    """A ``validation_fraction`` of train's distinct prompts, every row of each held out together."""
    prompts = list(dict.fromkeys(train["prompt"]))  # distinct, in file order
    random.Random(p.seed).shuffle(prompts)
    held_out = set(prompts[: round(len(prompts) * p.validation_fraction)])
    in_validation = [prompt in held_out for prompt in train["prompt"]]
    return DatasetDict(
        train=train.select([i for i, v in enumerate(in_validation) if not v]),
        validation=train.select([i for i, v in enumerate(in_validation) if v]),
    )
