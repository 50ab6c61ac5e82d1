"""Loggers with one signature: ``log(metrics, step)``, ``log_table(...)``, ``finish()``. The run's config goes to
wandb's run config when it starts, and to ``config.yaml`` beside the JSONL files (:mod:`.records`).

wandb runs offline unless the config asks for online (``logger.wandb_mode: online``), so nothing leaves
the machine by default; offline runs can be uploaded later with ``wandb sync``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping, Optional, Protocol, Sequence


class Logger(Protocol):
    def log(self, metrics: Mapping[str, float], step: int) -> None: ...
    def log_table(self, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int) -> None: ...
    def finish(self) -> None: ...


def read_jsonl(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """``(line, object)`` for each line of a JSONL log that holds an object with a ``"step"``; a line a killed
    writer left half-written is skipped."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and "step" in obj:
            out.append((line, obj))
    return out


class JSONLLogger:
    """``metrics.jsonl`` (one object per step, ``{"step": n, ...}``) and ``tables.jsonl`` in ``folder``."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._metrics = open(self.folder / "metrics.jsonl", "a")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        finite = {k: str(v) if isinstance(v, float) and not math.isfinite(v) else v for k, v in metrics.items()}
        self._metrics.write(json.dumps({"step": step, **finite}) + "\n")
        self._metrics.flush()

    def log_table(self, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int) -> None:
        with open(self.folder / "tables.jsonl", "a") as f:
            f.write(json.dumps({"step": step, "name": name, "columns": list(columns), "rows": [list(r) for r in rows]},
                               default=str) + "\n")

    def finish(self) -> None:
        self._metrics.close()


class WandbLogger:
    def __init__(self, folder: str | Path, project: str, name: str, mode: str = "offline",
                 group: Optional[str] = None, config: Optional[Mapping[str, Any]] = None):
        import wandb

        self._wandb = wandb
        self.run = wandb.init(project=project, name=name, group=group, dir=str(folder), mode=mode,
                              config=dict(config or {}), reinit="finish_previous")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(dict(metrics), step=step)

    def log_table(self, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int) -> None:
        self.run.log({name: self._wandb.Table(columns=list(columns), data=[list(r) for r in rows])}, step=step)

    def finish(self) -> None:
        self.run.finish()


class MultiLogger:
    def __init__(self, loggers: Sequence[Logger]):
        self.loggers = list(loggers)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for lg in self.loggers:
            lg.log(metrics, step)

    def log_table(self, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int) -> None:
        for lg in self.loggers:
            lg.log_table(name, columns, rows, step)

    def finish(self) -> None:
        for lg in self.loggers:
            lg.finish()


def build_logger(cfg: Any, run_dir: str | Path, name: str, config: Optional[Mapping[str, Any]] = None) -> Logger:
    """The loggers ``cfg`` (a LoggerConfig) enables, writing under ``run_dir``."""
    loggers: list[Logger] = []
    if cfg.jsonl_enabled:
        loggers.append(JSONLLogger(run_dir))
    if cfg.wandb_enabled and cfg.wandb_mode != "disabled":
        loggers.append(WandbLogger(run_dir, cfg.wandb_project, name, cfg.wandb_mode, cfg.wandb_group, config))
    return loggers[0] if len(loggers) == 1 else MultiLogger(loggers)  # none: a MultiLogger of none logs nothing
