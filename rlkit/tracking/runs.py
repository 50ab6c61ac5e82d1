"""Read a run folder back: ``rlkit.open_run(path)`` -> metrics, tables and summary as pandas objects.

Why: every run (``rlkit train``, a sweep's runs, a notebook session after ``log_to``) writes the same plain files
(:mod:`rlkit.tracking.records`): ``metrics.jsonl`` (one object per logged record), ``tables.jsonl`` (one object per
logged table), ``summary.json`` and ``config.yaml``. Reading them needs no wandb parser (wandb 0.31 dropped
``wandb sync --view``), and works the same for an online, an offline or no wandb run.

    run = rlkit.open_run("runs/quickstart")
    run.metrics[["step", "rollout/reward_mean"]]     # one row per step
    run.table("rollout/samples")                     # one row per logged sample, with the step it was logged at
    run.batch(12)                                    # step 12's whole batch (Trajectories), from rollouts/

Deliberate simplifications: everything is read at once (runs are thousands of steps, not millions); records
logged at the same step (a step's metrics and the held-out accuracy measured after it) are merged into one row,
each column keeping its latest value (accuracy measured twice at step 0, before and after SFT: the after).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pandas as pd
import yaml

from rlkit.tracking.loggers import read_jsonl
from rlkit.tracking.rollout_store import read_step, stored_steps, table_batch

_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}  # what JSONLLogger writes for them


@dataclass(frozen=True)
class RunRecords:
    """A run folder's records; ``metrics`` and ``tables`` are pandas DataFrames (empty when nothing was logged)."""

    folder: Path
    metrics: Any  # DataFrame: "step", then one column per metric, one row per step
    tables: Any  # DataFrame: "step", "table", then the tables' columns, one row per table row
    summary: Optional[dict[str, Any]]  # summary.json (None: the run wrote none, e.g. a notebook session)
    config: Optional[dict[str, Any]]  # config.yaml as a nested dict

    def table(self, name: str = "rollout/samples") -> Any:
        """The rows of the tables logged under ``name``, with their step (DataFrame); KeyError when none was (an
        empty frame would look like a run that logged empty tables)."""
        rows = self.tables[self.tables["table"] == name]
        if not len(rows):
            logged = sorted(set(self.tables["table"]))
            period = ((self.config or {}).get("logger") or {}).get("sample_table_period")
            steps = int(self.metrics["step"].max()) if len(self.metrics) else 0
            why = (f"; logger.sample_table_period={period} logs one every {period} steps, this run has {steps}"
                   if period is not None and name == "rollout/samples" else "")
            raise KeyError(f"no table {name!r} in {self.folder} (logged: {logged or 'none'}){why}. "
                           ".rollouts() reads every sample of the steps stored in rollouts/")
        return rows.dropna(axis=1, how="all").reset_index(drop=True)

    def batch(self, step: int, tokenizer: Any = None) -> Any:
        """The batch step ``step`` trained on (a :class:`rlkit.trajectories.Trajectories`), as the run stored it
        in ``rollouts/`` (:mod:`rlkit.tracking.rollout_store`); ``tokenizer`` lets its token views decode."""
        return table_batch(read_step(self.folder, step), tokenizer)

    def rollouts(self, steps: Optional[list[int]] = None) -> Any:
        """The stored batches as one table (DataFrame, one row per sample, per-token columns as lists): every
        kept step, or ``steps``."""
        frames = [read_step(self.folder, s).to_pandas() for s in (steps or stored_steps(self.folder))]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame({"step": pd.Series(dtype="int64")})

    def __repr__(self) -> str:
        steps = int(self.metrics["step"].max()) if len(self.metrics) else 0
        return (f"RunRecords({self.folder}: {len(self.metrics)} metric rows up to step {steps}, "
                f"{len(self.tables)} table rows, summary {'yes' if self.summary else 'no'})")


def open_run(path: str | Path) -> RunRecords:
    """The records of the run folder ``path`` (see the module docstring); FileNotFoundError if it holds none."""
    folder = Path(path)
    if not (folder / "metrics.jsonl").is_file() and not (folder / "summary.json").is_file():
        raise FileNotFoundError(f"{folder} holds no run records (metrics.jsonl, summary.json); a run folder is "
                                "<logger.log_dir>/<name>, e.g. runs/quickstart, or what session.log_to() returned")
    records = [{k: _NON_FINITE.get(v, v) if isinstance(v, str) else v for k, v in r.items()}
               for _, r in read_jsonl(folder / "metrics.jsonl")]
    metrics = pd.DataFrame(records)
    if len(metrics):
        metrics = metrics.groupby("step", sort=True).last().reset_index()  # same step: one row, the latest value
    else:
        metrics = pd.DataFrame({"step": pd.Series(dtype="int64")})
    rows = [{"step": t["step"], "table": t["name"], **dict(zip(t["columns"], row))}
            for _, t in read_jsonl(folder / "tables.jsonl") for row in t["rows"]]
    tables = pd.DataFrame(rows) if rows else pd.DataFrame({"step": pd.Series(dtype="int64"),
                                                           "table": pd.Series(dtype="object")})
    summary = json.loads((folder / "summary.json").read_text()) if (folder / "summary.json").is_file() else None
    config = yaml.safe_load((folder / "config.yaml").read_text()) if (folder / "config.yaml").is_file() else None
    return RunRecords(folder, metrics, tables, summary, config)
