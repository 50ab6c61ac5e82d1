"""A run's records (``config.yaml``, ``metrics.jsonl``, ``tables.jsonl``, ``summary.json``), replaced only once
the run has started.

Why: a run that fails to start (a broken model folder, a corrupt checkpoint, a fault while the engines come up)
must leave the records of the run it would have replaced exactly as they were. So :func:`start_records` is
called after the session is built and its checkpoint loaded, and writes each new file beside the old one
under a hidden temporary name (fsynced) before renaming it over the old one; a rename is atomic on POSIX.
The new records of a fresh start: this config, empty logs; of a resumed run: this config, the logs cut back
to the lines of the steps up to its checkpoint (a run killed after that checkpoint logged steps it will
log again).

What a start removes: only ``summary.json``, the summary of the run this one supersedes (left in place it
would describe the new logs). Nothing else in the folder is touched, whatever the folder is.

Deliberate simplifications: the files are renamed one after another, so a crash in that instant (no work
happens between the renames) can leave some of them new and some old; a crash between writing a new file and
renaming it leaves it as a hidden ``.<name>.new-<pid>-*`` file, which nothing reads.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any, Callable, ContextManager, Mapping, Optional

from rlkit.config.loading import config_to_yaml
from rlkit.notebook.display import SAMPLE_COLUMNS, sample_rows
from rlkit.tracking.checkpoint import fsync_path
from rlkit.tracking.loggers import build_logger, read_jsonl

LOGS = ("metrics.jsonl", "tables.jsonl")


def _lines_through(path: Path, step: int) -> str:
    """The lines of a JSONL log with ``"step" <= step``; a line a killed writer left half-written is dropped."""
    return "".join(line + "\n" for line, obj in read_jsonl(path)
                   if isinstance(obj["step"], (int, float)) and obj["step"] <= step)


def _write_beside(path: Path, text: str) -> Path:
    tmp = path.with_name(f".{path.name}.new-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.write_text(text)
    fsync_path(tmp)
    return tmp


def start_records(run_dir: str | Path, config_yaml: str, resumed_step: Optional[int] = None) -> None:
    """Make ``run_dir``'s records those of a run that starts now (``resumed_step`` None) or that continues
    from its checkpoint of step ``resumed_step``. Call it once the run has started (see the module docstring).
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    new = {"config.yaml": config_yaml}
    for name in LOGS:
        if (run_dir / name).exists() or name == "metrics.jsonl":
            new[name] = "" if resumed_step is None else _lines_through(run_dir / name, resumed_step)
    staged: dict[str, Path] = {}
    try:
        for name, text in new.items():
            staged[name] = _write_beside(run_dir / name, text)
        for name, tmp in staged.items():
            os.replace(tmp, run_dir / name)
    except BaseException:
        for tmp in staged.values():
            tmp.unlink(missing_ok=True)
        raise
    (run_dir / "summary.json").unlink(missing_ok=True)
    fsync_path(run_dir)


class RunRecorder:
    """One run's records as they are written: :func:`start_records` when it starts, then each step's metrics, a table
    of samples every ``logger.sample_table_period`` steps and the held-out accuracy, through the loggers
    ``logger.*`` enables (:func:`rlkit.tracking.loggers.build_logger`): the same files, and wandb run, whether a
    session records from notebook cells (``Session.log_to``) or ``rlkit train`` runs it.

    ``logger.*`` is read at each use (:meth:`follow`): a changed key finishes the loggers and builds them anew on
    the same folder (the JSONL files are appended to; wandb starts a new run of the same name).
    """

    def __init__(self, run_dir: str | Path, config: Any, resumed_step: Optional[int] = None):
        self.run_dir = Path(run_dir)
        start_records(self.run_dir, config_to_yaml(config), resumed_step)
        self.logger, self.logger_cfg, self._built = None, None, None
        self.follow(config)

    def follow(self, config: Any) -> None:
        """Loggers for ``config.logger``: rebuilt when a key they are built from changed (which loggers, wandb's
        project, mode and group); ``sample_table_period`` is read at each step."""
        built = {k: v for k, v in config.logger.model_dump().items() if k.startswith(("jsonl_", "wandb_"))}
        if self.logger is None or built != self._built:
            self.finish()
            self.logger = build_logger(config.logger, self.run_dir, config.name, config.model_dump(mode="json"))
            self._built = built
        self.logger_cfg = config.logger

    def log(self, values: Mapping[str, float], step: int) -> None:
        self.logger.log(values, step=step)

    def log_step(self, metrics: Any, batch: Any, timed: Callable[[str], ContextManager[None]]) -> None:
        """A step's ``metrics`` (StepMetrics), and at the table period the first ``logger.sample_table_rows``
        samples of ``batch`` (all of them when it is null); ``timed`` puts each on the step clock (``logging``,
        ``tables``)."""
        with timed("logging"):
            self.logger.log(metrics.values, step=metrics.step)
        period = self.logger_cfg.sample_table_period
        if period and metrics.step % period == 0 and batch is not None:
            with timed("tables"):
                limit = self.logger_cfg.sample_table_rows or batch.batch_size
                self.logger.log_table("rollout/samples", SAMPLE_COLUMNS, sample_rows(batch, limit), metrics.step)

    def finish(self) -> None:
        """Close the files and finish the wandb run; logging again rebuilds them (:meth:`follow`). Safe twice."""
        if self.logger is not None:
            self.logger.finish()
        self.logger = None
