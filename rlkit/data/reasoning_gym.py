"""reasoning-gym's tasks as prompt rows: ``data.task: reasoning_gym:<name>``, its generator keys in
``data.task_config``.

Why: reasoning-gym generates verifiable reasoning tasks in process from a seed, as rlkit's arithmetic task does,
so an RLVR run on them needs no download. The config names a task of reasoning-gym's registry (``rlkit tasks``
lists them) and passes its generator's keys through::

    data:
      task: reasoning_gym:chain_sum
      task_config: {min_digits: 1, max_digits: 2}
      num_train: 1000
      num_validation: 100
    env:
      name: reasoning_gym

A weighted mix is reasoning-gym's own composite dataset, under its own name and keys:
``task: reasoning_gym:composite`` with ``task_config: {datasets: [{name: chain_sum, weight: 2, config: {...}},
{name: leg_counting, weight: 1}]}`` (``weight`` defaults to 1, ``config`` to ``{}``); each entry says which task
made it (its ``source_dataset``), and its row is scored by that task.

Every problem of the config is reported before anything is generated: an unknown task (with the nearest names),
a key the task's generator does not have (with the keys it has), a value its own ``validate()`` refuses.

Splits: validation is the first ``num_validation`` distinct questions of the task drawn with seed
``data.seed + 2**24``, train the first ``num_train`` entries drawn with seed ``data.seed`` whose question is not
in validation. reasoning-gym's generators seed each entry with ``Random(seed + index)`` (a composite's tasks with
``seed + i + 1``), so the two streams share no entry until train draws 16M rows; the question check makes the
splits disjoint whatever a generator does. Train may repeat a question, as the arithmetic task's may.

Each row holds ``prompt`` (the question), ``answer`` (the oracle answer, None for tasks with many right answers)
and what :mod:`rlkit.envs.reasoning_gym` needs to score it: ``task``, ``task_config`` and ``metadata`` (JSON
text) and ``answer_tag`` (``data.system_prompt`` or the question asks for ``<answer>...</answer>``).

Deliberate simplifications: at most ``10 n + 100`` entries are drawn for a split of ``n`` rows, and a task with
fewer distinct questions than that asks for is refused (lower the counts or widen the config); no curricula
(reasoning-gym's difficulty schedules): a difficulty is a fixed ``task_config``.
"""

from __future__ import annotations

import difflib
import json
import numbers
from typing import Any, Iterator, Mapping, Optional

from rlkit.envs.reasoning_gym import (
    ANSWER_TAG,
    INSTALL,
    SET_BY_RLKIT,
    ReasoningGymMissing,
    check_config,
    config_keys,
    encode_metadata,
    import_reasoning_gym,
    task_description,
    task_names,
)
from rlkit.errors import ConfigError

PREFIX = "reasoning_gym:"  # data.task=reasoning_gym:<name>
COMPOSITE = "composite"  # reasoning-gym's weighted mix of tasks
VALIDATION_SEED_OFFSET = 2**24
_SPEC_KEYS = ("name", "weight", "config")
_EXAMPLE_MIX = "[{name: chain_sum, weight: 2}, {name: leg_counting, weight: 1, config: {max_animals: 5}}]"


def is_reasoning_gym_task(task: Any) -> bool:
    return isinstance(task, str) and task.startswith(PREFIX)


def reasoning_gym_tasks() -> list[tuple[str, str]]:
    """``("reasoning_gym:<name>", the first line of its docstring)`` for every task reasoning-gym registers."""
    return [(PREFIX + name, task_description(name)) for name in task_names()]


def reasoning_gym_problems(task: str, task_config: Any) -> list[str]:
    """Every problem with ``data.task=task`` and ``data.task_config=task_config``, each with its dotted key."""
    name = task[len(PREFIX):]
    try:
        names = task_names()
    except ReasoningGymMissing as exc:
        return [f"data.task={task!r}: {exc}"]
    if name not in names:
        return [f"data.task={task!r}: reasoning-gym has no task {name!r}{_nearest(name, names)}. `rlkit tasks` lists "
                f"every task"]
    if not isinstance(task_config, Mapping):
        return [f"data.task_config: must be a mapping of {name}'s generator keys, got {task_config!r}"]
    if name == COMPOSITE:
        return _composite_problems(task_config, names)
    return _config_problems(name, task_config, "data.task_config")


def suggest_reasoning_gym_task(task: Any) -> str:
    """``; did you mean 'reasoning_gym:chain_sum'?`` for a bare reasoning-gym name (or a near one); "" when none is
    near; the install command when reasoning-gym is not installed."""
    if not isinstance(task, str):
        return ""
    try:
        names = task_names()
    except ReasoningGymMissing:
        return f"; reasoning-gym is not installed: {INSTALL}"
    close = [task] if task in names else difflib.get_close_matches(task, names, n=2, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(PREFIX + c) for c in close)}?" if close else ""


def _nearest(name: str, names: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(PREFIX + c for c in close)}?)" if close else ""


def _config_problems(name: str, config: Mapping[str, Any], key: str) -> list[str]:
    known = config_keys(name)
    out = []
    for k in config:
        if k in SET_BY_RLKIT:
            out.append(f"{key}.{k}: set by rlkit, from data.seed and data.num_train / data.num_validation; remove it")
        elif k not in known:
            hint = difflib.get_close_matches(str(k), known, n=1)
            out.append(f"{key}.{k}: reasoning-gym task {name!r} has no key {k!r}"
                       + (f"; did you mean {key}.{hint[0]}?" if hint else "")
                       + f" (its keys: {', '.join(known) or 'none'})")
    if not out:
        why = check_config(name, dict(config))
        if why is not None:
            out.append(f"{key}={dict(config)}: reasoning-gym's {name} config refuses it ({why}). Fix: change the "
                       f"values (its keys: {', '.join(known)})")
    return out


def _composite_problems(config: Mapping[str, Any], names: tuple[str, ...]) -> list[str]:
    out = [f"data.task_config.{k}: the composite's only key is datasets, a weighted list of tasks: {_EXAMPLE_MIX}"
           for k in config if k != "datasets"]
    specs = config.get("datasets")
    if not isinstance(specs, list) or not specs:
        return out + [f"data.task_config.datasets: the composite needs a non-empty list of tasks, e.g. {_EXAMPLE_MIX}"
                      f" (got {specs!r})"]
    seen: set[str] = set()
    for i, spec in enumerate(specs):
        key = f"data.task_config.datasets[{i}]"
        if not isinstance(spec, Mapping):
            out.append(f"{key}: must be a mapping {{name: <task>, weight: <number>, config: {{...}}}}, got {spec!r}")
            continue
        out += [f"{key}.{k}: unknown key; a task of the mix has {', '.join(_SPEC_KEYS)}" for k in spec
                if k not in _SPEC_KEYS]
        name, weight, task_config = spec.get("name"), spec.get("weight", 1), spec.get("config", {})
        if not isinstance(weight, numbers.Real) or isinstance(weight, bool) or not weight > 0:
            out.append(f"{key}.weight: must be a number > 0, got {weight!r}")
        if name == COMPOSITE or not isinstance(name, str) or name not in names:
            out.append(f"{key}.name: reasoning-gym has no task {name!r}"
                       f"{_nearest(name, names) if isinstance(name, str) else ''}; `rlkit tasks` lists them")
            continue
        if name in seen:
            out.append(f"{key}.name: {name!r} is in the mix twice; give it once, with the sum of the weights")
        seen.add(name)
        if not isinstance(task_config, Mapping):
            out.append(f"{key}.config: must be a mapping of {name}'s generator keys, got {task_config!r}")
        else:
            out += _config_problems(name, task_config, f"{key}.config")
    return out


def reasoning_gym_splits(task: str, task_config: Mapping[str, Any], seed: int, num_train: int, num_validation: int,
                         system_prompt: Optional[str] = None) -> dict[str, list[dict[str, Any]]]:
    """``{"train": rows, "validation": rows}`` of the task (see the module docstring), questions disjoint.

    Each row: ``prompt``, ``answer``, ``task``, ``task_config``, ``metadata``, ``answer_tag``.
    """
    problems = reasoning_gym_problems(task, task_config)
    if problems:
        raise ConfigError(problems)
    name, tag = task[len(PREFIX):], system_prompt is not None and ANSWER_TAG in system_prompt
    validation: dict[str, dict[str, Any]] = {}  # question -> its first row
    for row in _rows(name, task_config, seed + VALIDATION_SEED_OFFSET, 10 * num_validation + 100, tag):
        validation.setdefault(row["prompt"], row)
        if len(validation) == num_validation:
            break
    else:
        raise ConfigError([f"data.num_validation={num_validation}: {task} with data.task_config={dict(task_config)} "
                           f"gave only {len(validation)} distinct questions in {10 * num_validation + 100} draws. Fix: "
                           "lower data.num_validation, or widen the task's range in data.task_config"])
    train = []
    for row in _rows(name, task_config, seed, 10 * num_train + 100, tag):
        if row["prompt"] not in validation:
            train.append(row)
            if len(train) == num_train:
                break
    else:
        raise ConfigError([f"data.num_train={num_train}: {task} with data.task_config={dict(task_config)} gave only "
                           f"{len(train)} train rows whose question is not held out, in {10 * num_train + 100} draws "
                           "(the task has few distinct questions). Fix: lower data.num_train or data.num_validation, "
                           "or widen the task's range in data.task_config"])
    return {"train": train, "validation": list(validation.values())}


def _rows(name: str, task_config: Mapping[str, Any], seed: int, size: int, tag: bool) -> Iterator[dict[str, Any]]:
    """Rows of the dataset ``name`` made with ``seed`` and ``size``, drawn lazily (index 0, 1, ...)."""
    rg = import_reasoning_gym()
    if name == COMPOSITE:
        from reasoning_gym.composite import DatasetSpec

        specs = [DatasetSpec(name=s["name"], weight=s.get("weight", 1), config=dict(s.get("config", {})))
                 for s in task_config["datasets"]]
        configs = {s.name: _config_json(s.config) for s in specs}
        dataset = rg.create_dataset(COMPOSITE, datasets=specs, seed=seed, size=size)
    else:
        configs = {name: _config_json(task_config)}
        dataset = rg.create_dataset(name, **task_config, seed=seed, size=size)
    for index in range(size):
        entry = dataset[index]
        source = entry["metadata"].get("source_dataset", name) if name == COMPOSITE else name
        answer = entry["answer"]
        yield {
            "prompt": entry["question"],
            "answer": None if answer is None else str(answer),
            "task": source,
            "task_config": configs[source],
            "metadata": encode_metadata(entry["metadata"]),
            "answer_tag": tag or ANSWER_TAG in entry["question"],
        }


def _config_json(config: Mapping[str, Any]) -> str:
    return json.dumps(dict(config), sort_keys=True)
