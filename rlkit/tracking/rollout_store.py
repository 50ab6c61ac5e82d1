"""Each step's batch on disk: one parquet file per step in ``<run folder>/rollouts/``, read back by
``rlkit.open_run(folder).batch(k)``.

Why parquet through ``datasets``: a stored batch is a table (one row per sample) that pandas, ``datasets`` and
DuckDB open as they are, and its per-token columns (lists of float32) round-trip bit for bit, so a batch read
back trains, replays and scores exactly as the one the step used.

One row per sample ``i`` of a batch of ``B`` rows padded to width ``T``:

    step, sample, prompt, completion, finish_reason, reward        scalars and text
    input_ids, attention_mask, loss_mask                           [T] each (the full padded row, exact)
    generator_logprobs, prev_logprobs, ref_logprobs, advantages,   [T] float32 each (null when the batch had none)
    entropy, turn_rewards
    group_size, generator_version, policy_version, seed            the batch's facts, repeated per row
    row, env_metadata                                              JSON text (the dataset row of the sample's group)

Bounds (``history.disk_max_rows``, ``history.disk_max_bytes``): after each write the oldest files are deleted
until both hold; a single step larger than the bound is still written (and deleted at the next write).

Deliberate simplifications: ``reward_errors`` and ``info`` are not stored; ``rows`` is kept per group as JSON,
so values that are not JSON-able become strings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from datasets import Dataset, Features, Sequence, Value
import pyarrow.parquet as pq
import torch

from rlkit.trajectories import Trajectories

FOLDER = "rollouts"
_TOKEN_FLOATS = ("generator_logprobs", "prev_logprobs", "ref_logprobs", "advantages", "entropy", "turn_rewards")


@dataclass(frozen=True)
class StepFacts:
    """What a stored batch does not carry itself."""

    step: int  # RL steps completed with this batch's step (1 for the first)
    policy_version: int  # optimizer steps the policy had taken after the step
    seed: int  # the step's sampling seed


def batch_table(batch: Trajectories, facts: StepFacts) -> dict[str, list]:
    """The columns of ``batch`` (see the module docstring), one entry per sample."""
    n = batch.batch_size
    rows = batch.row_of_sample
    columns: dict[str, list] = {
        "step": [facts.step] * n, "sample": list(range(n)), "prompt": list(batch.prompts),
        "completion": list(batch.completions), "finish_reason": list(batch.finish_reasons),
        "reward": batch.rewards.tolist() if batch.rewards is not None else [None] * n,
        "input_ids": batch.input_ids.tolist(), "attention_mask": batch.attention_mask.tolist(),
        "loss_mask": batch.loss_mask.tolist(),
        "group_size": [batch.group_size] * n, "generator_version": [batch.policy_version] * n,
        "policy_version": [facts.policy_version] * n, "seed": [facts.seed] * n,
        "row": [json.dumps(r, default=str) for r in rows] if rows else [None] * n,
        "env_metadata": ([json.dumps(m, default=str) for m in batch.env_metadata] if batch.env_metadata
                         else [None] * n),
    }
    for name in _TOKEN_FLOATS:
        value = getattr(batch, name)
        columns[name] = value.float().tolist() if value is not None else [None] * n
    return columns


def _features():
    floats = Sequence(Value("float32"))
    return Features({
        "step": Value("int64"), "sample": Value("int64"), "prompt": Value("string"), "completion": Value("string"),
        "finish_reason": Value("string"), "reward": Value("float32"), "input_ids": Sequence(Value("int64")),
        "attention_mask": Sequence(Value("bool")), "loss_mask": Sequence(Value("bool")),
        "group_size": Value("int64"), "generator_version": Value("int64"), "policy_version": Value("int64"),
        "seed": Value("int64"), "row": Value("string"), "env_metadata": Value("string"),
        **{name: floats for name in _TOKEN_FLOATS}})


def table_batch(table: Any, tokenizer: Any = None) -> Trajectories:
    """The :class:`Trajectories` a table of :func:`batch_table`'s columns holds (a ``datasets.Dataset`` or a
    dict of columns), bit for bit as it was stored."""
    col = table.to_dict() if hasattr(table, "to_dict") and not isinstance(table, dict) else table
    g = int(col["group_size"][0])

    def floats(name: str) -> Optional[torch.Tensor]:
        values = col[name]
        return None if values[0] is None else torch.tensor(values, dtype=torch.float32)

    rows = tuple(json.loads(r) for r in col["row"][::g]) if col["row"][0] is not None else ()
    meta = tuple(json.loads(m) for m in col["env_metadata"]) if col["env_metadata"][0] is not None else ()
    return Trajectories(
        prompts=tuple(col["prompt"]), completions=tuple(col["completion"]),
        input_ids=torch.tensor(col["input_ids"], dtype=torch.int64),
        attention_mask=torch.tensor(col["attention_mask"], dtype=torch.bool),
        loss_mask=torch.tensor(col["loss_mask"], dtype=torch.bool),
        generator_logprobs=floats("generator_logprobs"), finish_reasons=tuple(col["finish_reason"]),
        group_size=g, policy_version=int(col["generator_version"][0]), rows=rows, rewards=floats("reward"),
        turn_rewards=floats("turn_rewards"), env_metadata=meta, advantages=floats("advantages"),
        prev_logprobs=floats("prev_logprobs"), ref_logprobs=floats("ref_logprobs"), entropy=floats("entropy"),
        rollout_step=int(col["step"][0]) - 1, tokenizer=tokenizer)


def step_file(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / FOLDER / f"step_{step:08d}.parquet"


def stored_steps(run_dir: str | Path) -> list[int]:
    """The steps whose batches ``run_dir`` holds, oldest first."""
    folder = Path(run_dir) / FOLDER
    return sorted(int(p.stem.removeprefix("step_")) for p in folder.glob("step_*.parquet")) if folder.is_dir() else []


class RolloutFiles:
    """Writes each step's batch into ``<run_dir>/rollouts`` and keeps the folder within its bounds."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self._sizes: Optional[dict[int, tuple[int, int]]] = None  # step -> (rows, bytes) of the files present

    def write(self, batch: Trajectories, facts: StepFacts, max_rows: int, max_bytes: int) -> Optional[Path]:
        """Store ``batch`` as step ``facts.step`` (replacing a file of that step), then delete the oldest files
        until at most ``max_rows`` rows and ``max_bytes`` bytes remain (the new file always stays). Nothing is
        written when ``max_rows`` or ``max_bytes`` is 0."""
        if max_rows == 0 or max_bytes == 0:
            return None

        path = step_file(self.run_dir, facts.step)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        # the Arrow table datasets builds with the features' schema, written as it is (to_parquet shows a progress bar)
        pq.write_table(Dataset.from_dict(batch_table(batch, facts), features=_features()).data.table, str(tmp))
        tmp.replace(path)
        sizes = self._known_sizes()
        sizes[facts.step] = (batch.batch_size, path.stat().st_size)
        for step in sorted(sizes):
            rows, size = (sum(v[i] for v in sizes.values()) for i in (0, 1))
            if step == facts.step or (rows <= max_rows and size <= max_bytes):
                break
            step_file(self.run_dir, step).unlink(missing_ok=True)
            del sizes[step]
        return path

    def _known_sizes(self) -> dict[int, tuple[int, int]]:
        if self._sizes is None:
            self._sizes = {s: (pq.read_metadata(step_file(self.run_dir, s)).num_rows,
                               step_file(self.run_dir, s).stat().st_size) for s in stored_steps(self.run_dir)}
        return self._sizes


def read_step(run_dir: str | Path, step: int) -> Any:
    """The stored table of step ``step`` as a ``datasets.Dataset``; KeyError naming the steps kept if absent."""
    path = step_file(run_dir, step)
    if not path.is_file():
        kept = stored_steps(run_dir)
        where = f"steps {kept[0]}..{kept[-1]}" if kept else "no steps"
        raise KeyError(f"{run_dir} holds no batch of step {step} ({where} are kept: history.disk_max_rows and "
                       "history.disk_max_bytes bound the folder, the oldest going first)")

    return Dataset(pq.read_table(str(path)))
