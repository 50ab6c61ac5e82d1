"""A run's memory of its past steps: each step's batch and settings (a bounded ring), the policy states the last
steps started from (a bounded ring of snapshots), and, while the session records, each batch on disk.

Why: "what would step 20 have done under GSPO?" needs step 20's batch, the loss and advantage settings it
trained with, and the weights it started from; none of them survives the step otherwise. ``session.history[k]``
(a :class:`rlkit.run.metrics.StepMetrics`) then carries its batch as ``.batch`` while the ring keeps it.

Bounds (``history.*``, read at every step): at most ``max_steps`` batches and ``max_bytes`` bytes of them in
memory, at most ``snapshots`` policy states, and the disk folder's own bounds
(:mod:`rlkit.tracking.rollout_store`). The oldest entry goes first; a batch larger than ``max_bytes`` alone is
not kept. A snapshot with adapters off is every trainable weight, so it is kept only with
``history.full_weight_snapshots=true``.

Deliberate simplifications: the ring is part of the run state (a ``reset()`` or a restored checkpoint starts it
empty; each branch of a fork has its own); a step that took several optimizer updates (epochs, minibatches) keeps
the state it started from only, so replaying it is exact for its first update's loss, not the mean.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Optional

from torch import Tensor

from rlkit.algorithms import AdvantageParams
from rlkit.policy.base import LossFn
from rlkit.policy.snapshots import capture_weights
from rlkit.run.metrics import StepMetrics
from rlkit.stages.settings import TrainSettings
from rlkit.tracking.checkpoint import STEP_DIR, checkpoint_folder, list_checkpoints
from rlkit.tracking.rollout_store import RolloutFiles, StepFacts
from rlkit.trajectories import Trajectories


@dataclass(frozen=True)
class StepRecord:
    """One completed step as the store keeps it: what replaying it needs."""

    step: int  # RL steps completed with this one (history[k].step)
    batch: Trajectories  # the batch trained on, every stage's output in it
    seed: int  # the step's sampling seed
    version_before: int  # policy version the step's update started from
    policy_version: int  # policy version after the step
    loss_fn: LossFn  # the loss it trained with
    estimator: Any  # grpo.advantage_estimator (a name, or a function of yours)
    advantage_params: AdvantageParams
    train: TrainSettings
    metrics: StepMetrics = field(repr=False)

    @property
    def nbytes(self) -> int:
        """Bytes the batch holds in memory: its tensors and its text (UTF-8)."""
        tensors = sum(v.numel() * v.element_size() for v in vars(self.batch).values() if isinstance(v, Tensor))
        return tensors + sum(len(s.encode()) for s in self.batch.prompts + self.batch.completions)


class RolloutHistory:
    """The in-memory rings (batches, policy snapshots) and, once given a run folder, the disk store."""

    def __init__(self) -> None:
        self.records: OrderedDict[int, StepRecord] = OrderedDict()  # step -> record, oldest first
        self.snapshots: OrderedDict[int, dict[str, Tensor]] = OrderedDict()  # step -> weights it started from
        self.files = None  # a RolloutFiles while the session records
        self.unsnapshotted: list[int] = []  # steps whose full weights were not kept (full_weight_snapshots off)

    # ---- adding ---------------------------------------------------------------------------------
    def add(self, record: StepRecord, max_steps: int, max_bytes: int) -> None:
        """Keep ``record`` (its metrics get ``.batch``), then drop the oldest until within the bounds."""
        if max_steps == 0 or record.nbytes > max_bytes:
            return
        self.records[record.step] = record
        record.metrics.batch = record.batch
        while len(self.records) > max_steps or sum(r.nbytes for r in self.records.values()) > max_bytes:
            _, old = self.records.popitem(last=False)
            old.metrics.batch = None

    def add_snapshot(self, step: int, weights: dict[str, Tensor], keep: int) -> None:
        """Keep the weights step ``step`` starts from; at most ``keep`` snapshots, the oldest dropped."""
        if keep == 0:
            return
        self.snapshots[step] = weights
        while len(self.snapshots) > keep:
            self.snapshots.popitem(last=False)

    def drop_snapshot(self, step: int) -> None:
        """Forget the snapshot of a step that did not complete (interrupted before its update)."""
        self.snapshots.pop(step, None)

    # ---- reading --------------------------------------------------------------------------------
    def record(self, step: int) -> StepRecord:
        """The record of step ``step``; KeyError naming the steps kept if it is gone."""
        if step not in self.records:
            kept = list(self.records)
            where = f"steps {kept[0]}..{kept[-1]}" if kept else "no steps"
            raise KeyError(f"step {step}'s batch is not in memory ({where} are: history.max_steps and "
                           "history.max_bytes bound the ring); rlkit.open_run(folder).batch(step) reads a recorded "
                           "session's batches from disk")
        return self.records[step]

    def weights(self, step: int) -> dict[str, Tensor]:
        """The weights step ``step`` started from; KeyError saying which snapshots exist and why."""
        if step in self.unsnapshotted:
            raise KeyError(f"no weight snapshot for step {step}: with adapters off a snapshot is every weight, kept "
                           "only with history.full_weight_snapshots=true, which was off when it ran. It is a live key: "
                           "session.configure(['history.full_weight_snapshots=true']) makes the steps from then on "
                           "replayable (the ones already taken are not)")
        if step not in self.snapshots:
            raise KeyError(f"no weight snapshot for step {step} (snapshots kept: {list(self.snapshots) or 'none'}); "
                           "history.snapshots sets how many are kept")
        return self.snapshots[step]

    @property
    def nbytes(self) -> int:
        """Bytes the in-memory batches and snapshots hold."""
        snaps = sum(t.numel() * t.element_size() for w in self.snapshots.values() for t in w.values())
        return sum(r.nbytes for r in self.records.values()) + snaps

    def __repr__(self) -> str:
        steps = list(self.records)
        return (f"RolloutHistory({len(steps)} batches{f' (steps {steps[0]}..{steps[-1]})' if steps else ''}, "
                f"snapshots of steps {list(self.snapshots)}, {self.nbytes / 2**20:.1f} MiB)")


def weights_at(history: RolloutHistory, config: Any, step: Optional[int] = None) -> Any:
    """Which weights steps started from exist: a snapshot in memory ("snapshot", what ``replay`` uses) or a
    periodic checkpoint (its path: the checkpoint after step k holds the weights step k + 1 started from; load it
    with ``Session.load``). For ``step``: one of them or None; without one: {step: where} for every step."""
    found: dict[int, Any] = {int(STEP_DIR.match(p.name).group(1)) + 1: str(p)
                             for p in list_checkpoints(checkpoint_folder(config))}
    found.update({s: "snapshot" for s in history.snapshots})
    return found.get(step) if step is not None else dict(sorted(found.items()))


# ---- what a run's train() calls ------------------------------------------------------------------------
def before_train(store: RolloutHistory, policy: Any, config: Any, step: int) -> None:
    """Snapshot the weights the coming update (of step ``step + 1``) starts from, when ``history.*`` asks for it and
    the weights are in this process (a Ray worker group's are not: its steps keep no snapshot)."""
    cfg = config.history
    if cfg.snapshots and not (cfg.full_weight_snapshots or config.policy.lora_cfg.enabled):
        store.unsnapshotted = [*store.unsnapshotted[-cfg.snapshots + 1:], step + 1]  # for replay's message
    elif cfg.snapshots and getattr(policy, "model", None) is not None:
        store.add_snapshot(step + 1, capture_weights(policy), cfg.snapshots)


def after_train(store: RolloutHistory, records: Any, config: Any, batch: Trajectories, metrics: StepMetrics,
                version_before: int, seed: int, loss_fn: LossFn, train: TrainSettings,
                timed: Callable[[str], ContextManager[None]]) -> None:
    """Keep the completed step's record (``seed``: its sampling seed; ``loss_fn`` and ``train``: what it trained
    with) in memory and, while the run records (``records``: its RunRecorder, else None), on disk."""
    cfg = config.history
    record = StepRecord(metrics.step, batch, seed, version_before, metrics.policy_version, loss_fn,
                        config.grpo.advantage_estimator, config.grpo.advantage_params(), train, metrics)
    store.add(record, cfg.max_steps, cfg.max_bytes)
    if records is not None:
        if store.files is None or store.files.run_dir != records.run_dir:
            store.files = RolloutFiles(records.run_dir)
        with timed("tables"):
            store.files.write(batch, StepFacts(metrics.step, metrics.policy_version, seed), cfg.disk_max_rows,
                              cfg.disk_max_bytes)
