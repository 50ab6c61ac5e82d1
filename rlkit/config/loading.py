"""Load a run config from a shipped preset or a YAML file, apply dotted overrides, validate everything.

Every problem is collected and raised together as one :class:`rlkit.errors.ConfigError`, before any model
or engine starts: unknown keys (with the nearest known key), wrong types, and impossible combinations.
A YAML file may name ``base: <preset or path>`` to start from another config. A value written ``???`` (the
mark NeMo-RL's Hydra/OmegaConf configs use) is one the user must give, e.g. the model folder of a preset
meant for the user's own checkpoint; left unset it is reported by key with the other problems.
"""

from __future__ import annotations

import copy
import difflib
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml
from pydantic import TypeAdapter, ValidationError

from rlkit.config.checks import cross_section_problems, generation_fallback
from rlkit.config.run import RunConfig
from rlkit.errors import ConfigError, describe_invalid

PRESET_DIR = Path(__file__).parent / "presets"


def available_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def _read_yaml(source: str | Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    path = Path(source)
    if not path.suffix and (PRESET_DIR / f"{source}.yaml").is_file():
        path = PRESET_DIR / f"{source}.yaml"
    if not path.is_file():
        hint = difflib.get_close_matches(str(source), available_presets(), n=1)
        raise ConfigError([
            f"config {str(source)!r} is neither a shipped preset nor a file"
            + (f" (did you mean {hint[0]!r}?)" if hint else "")
            + f"; presets: {', '.join(available_presets())}"
        ])
    if path.resolve() in seen:
        raise ConfigError([f"config {path} names itself as a base (cycle: {' -> '.join(map(str, seen))})"])
    raw = _parse_yaml_file(path)
    base = raw.pop("base", None)
    if base is None:
        return raw
    if not isinstance(base, str):
        raise ConfigError([f"config file {str(path)!r}: base={base!r} must name a preset or a YAML file"])
    base_path = base if (PRESET_DIR / f"{base}.yaml").is_file() else path.parent / base
    return deep_merge(_read_yaml(base_path, seen + (path.resolve(),)), raw)


def _parse_yaml_file(path: Path) -> dict[str, Any]:
    """The file's mapping of sections; bad text, bad YAML or another shape is a ``ConfigError`` naming the
    file (and the line), not a parser traceback. An empty file is an empty mapping."""
    where = f"config file {str(path)!r}"
    try:
        raw = _parse_yaml(path.read_text(encoding="utf-8"), where)
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{where} is not UTF-8 text ({exc.reason} at byte {exc.start}). Fix: save it as UTF-8"]) \
            from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError([f"{where} holds a YAML {type(raw).__name__}, not a mapping of sections. Fix: write "
                           "it as `section: {key: value}` lines, e.g. `grpo: {num_prompts_per_step: 8}`"])
    return raw


def _parse_yaml(text: str, where: str) -> Any:
    """``yaml.safe_load(text)``, or a ``ConfigError`` naming ``where``, the line, the column and the reason."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        reason = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError([f"{where} is not valid YAML{at}: {reason}. Fix: correct the YAML there (a value holding "
                           "': ', '#', or starting with '[', '{' or a quote needs quotes around it)"]) from None


def deep_merge(base: dict, update: Mapping) -> dict:
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


_NUMBER = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def parse_value(text: str, where: str) -> Any:
    """``text`` as YAML (None when blank), plus the numbers YAML 1.1 reads as strings (``3e-4``; quoted,
    ``'3e-4'`` stays a string); a ``ConfigError`` naming ``where`` when it is not YAML."""
    value = _parse_yaml(text, where) if text.strip() else None
    return float(value) if isinstance(value, str) and _NUMBER.match(text.strip()) else value


def parse_overrides(overrides: Sequence[str] | Mapping[str, Any]) -> dict[str, Any]:
    """``["grpo.num_generations_per_prompt=8", ...]`` (values by :func:`parse_value`) or ``{"a.b": value}`` as
    ``{"a.b": value}``; every malformed override is reported in one ``ConfigError``."""
    if isinstance(overrides, Mapping):
        return dict(overrides)
    out, problems = {}, []
    for override in overrides:
        key, sep, value = override.partition("=")
        if not sep:
            problems.append(f"override {override!r} is not of the form key=value (e.g. grpo.num_prompts_per_step=8)")
            continue
        try:
            out[key.strip()] = parse_value(value, f"override {override!r}: the value")
        except ConfigError as exc:
            problems += exc.problems
    if problems:
        raise ConfigError(problems)
    return out


def apply_overrides(raw: dict, overrides: Mapping[str, Any]) -> dict:
    """``raw`` with each ``{"a.b": value}`` set; a key that passes through a value is a ``ConfigError``."""
    out, problems = copy.deepcopy(raw), []
    for key, value in overrides.items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                problems.append(f"{key}: {part!r} is a value, not a section")
                break
        else:
            node[leaf] = value
    if problems:
        raise ConfigError(problems)
    return out


REQUIRED = "???"


def _take_required(raw: Mapping[str, Any], prefix: str = "") -> tuple[dict, list[str]]:
    """``raw`` without its ``???`` values, and their dotted keys."""
    out, keys = {}, []
    for key, value in raw.items():
        if isinstance(value, Mapping):
            out[key], inner = _take_required(value, f"{prefix}{key}.")
            keys += inner
        elif isinstance(value, str) and value.strip() == REQUIRED:
            keys.append(f"{prefix}{key}")
        else:
            out[key] = value
    return out, keys


def validate(raw: Mapping[str, Any]) -> RunConfig:
    """Validate section by section so that every problem is reported at once, then check combinations. Where the
    generation engine cannot run the model on this machine's CPU, the transformers generator takes over, with a
    one-line notice (:func:`rlkit.config.checks.generation_fallback`)."""
    raw, required = _take_required(raw)
    problems: list[str] = [f"{key}: this config leaves it for you to set (it says {REQUIRED}). Fix: give it, "
                           f"e.g. `{key}=...` after the config on the command line" for key in required]
    sections: dict[str, Any] = {}
    fields = RunConfig.model_fields
    for key, value in raw.items():
        if key not in fields:
            problems.append(describe_invalid({"loc": (key,), "type": "extra_forbidden"}, root=RunConfig))
            continue
        try:
            sections[key] = TypeAdapter(fields[key].annotation).validate_python(value)
        except ValidationError as e:  # each distinct line once (errors that differ only in a stripped loc part)
            problems += dict.fromkeys(describe_invalid(err, (key,), fields[key].annotation) for err in e.errors())
        except ConfigError as e:
            problems.extend(f"{key}.{p}" if not p.startswith(key) else p for p in e.problems)
    if problems:
        if not required:  # combinations with an unset value would report it again, less clearly
            problems += cross_section_problems(generation_fallback(sections, notice=False))
        raise ConfigError(problems)
    config = RunConfig(**generation_fallback(sections))
    problems = cross_section_problems(config.__dict__)
    if problems:
        raise ConfigError(problems)
    return config


def load_config(source: str | Path | Mapping[str, Any] = "quickstart",
                overrides: Sequence[str] | Mapping[str, Any] = ()) -> RunConfig:
    """A validated :class:`RunConfig` from a preset name, a YAML path or a mapping, plus overrides."""
    raw = dict(source) if isinstance(source, Mapping) else _read_yaml(source)
    return validate(apply_overrides(raw, parse_overrides(overrides)))


def config_to_yaml(config: RunConfig) -> str:
    """The fully resolved config as YAML (what a run records next to its metrics)."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
