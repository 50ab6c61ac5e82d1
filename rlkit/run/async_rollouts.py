"""Async GRPO: a background producer samples the rollouts of later steps while the policy trains.

One thread drives the generator (the in-process engine or the Ray actor) and fills a small queue; the
trainer takes the next ready batch. Two rules bound how off-policy the training data gets, as in NeMo-RL's
``async_grpo`` (``max_trajectory_age_steps``):

* **Production is gated.** With weights loaded at step ``w``, the producer only samples batches meant for
  steps ``w .. w + max_age``; when those are queued it waits for the next refit instead of sampling data
  that would be too old to use.
* **Consumption is checked.** A batch whose weights are more than ``max_age`` steps behind the policy when
  the trainer asks for it (``policy.version - batch.policy_version > max_age * updates_per_step``) is
  dropped and counted, never trained on. Normally the gate makes this rare; it catches batches overtaken
  by extra updates (an SFT call, manual train() calls, a missed refit).

A lock keeps the generator to one user at a time: a refit (or an evaluation) waits for the batch being
sampled, and the producer does not start a new one while a refit is waiting. The loss corrects the
remaining lag with importance weights against ``Trajectories.generator_logprobs`` (the config check
requires ``loss_fn.off_policy_correction`` != none).

Deliberate simplifications: one batch is sampled with one weight version (no mid-batch weight updates, no
per-group versions); prompts are drawn in the producer, so a checkpoint taken mid-run records a sampler
position that is ahead by the queued batches.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, deque
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

from rlkit.errors import StageOrderError
from rlkit.notebook.html import CodeRepr
from rlkit.trajectories import Trajectories

MakeBatch = Callable[[int, int], Trajectories]  # (batch index, generator's policy version) -> Trajectories
POLL_S = 0.05  # waits poll, so a notebook interrupt (Ctrl-C) is seen promptly


class AsyncRollouts(CodeRepr):
    """The producer thread and the queue between it and the trainer (see the module docstring).

    ``make_batch(index, version)`` samples batch ``index`` with the generator, which holds ``version``;
    it runs in the producer thread. The thread starts on the first ``batch_for_step`` call.
    """

    def __init__(self, make_batch: MakeBatch, max_age_steps: int, generator_version: int = 0, step: int = 0):
        if max_age_steps < 1:
            raise ValueError(f"max_age_steps={max_age_steps}: must be >= 1 (0 would be synchronous GRPO)")
        self.make_batch = make_batch
        self.max_age_steps = max_age_steps
        self._cond = threading.Condition()
        self._ready: deque[tuple[int, Trajectories]] = deque()  # (target step, batch), in target order
        self._version, self._weights_step = generator_version, step
        self._trainer_step = step
        self._next_target = step  # the step the next sampled batch is meant for
        self._next_index = 0  # batch counter: seeds and prompts follow it
        self._busy = False  # the producer is sampling
        self._exclusive_owner: Optional[int] = None
        self._exclusive_depth = 0
        self._exclusive_waiting = 0
        self._stop = False
        self._error: Optional[BaseException] = None
        self._thread: Optional[threading.Thread] = None
        self._current: Optional[tuple[int, Trajectories]] = None  # the batch handed out for a step
        self._idle_since_handout = 0.0
        self.dropped_batches = self.dropped_samples = 0
        self.last_exclusive_wait = 0.0  # seconds the last exclusive() (a refit) waited for the batch being sampled
        self.lag_counts: Counter[int] = Counter()  # steps of lag of the batches handed to the trainer

    # ---- trainer side -----------------------------------------------------------------------------
    def batch_for_step(self, step: int, policy_version: int, updates_per_step: int = 1) -> Trajectories:
        """The batch to train on at ``step`` (the same one again if asked twice for one step).

        Waits for one if none is ready. ``policy_version`` is the policy's version now; ``updates_per_step``
        how many optimizer steps one RL step takes (versions per step), so ages are counted in steps.
        """
        if self._current is not None and self._current[0] == step:
            return self._current[1]
        t0 = time.perf_counter()
        with self._cond:
            self._trainer_step = step
            self._next_target = max(self._next_target, step)
            self._start_locked()
            self._cond.notify_all()
            while True:
                self._raise_producer_error()
                while self._ready:
                    target, batch = self._ready.popleft()
                    lag_versions = policy_version - batch.policy_version
                    if lag_versions <= self.max_age_steps * updates_per_step:
                        return self._hand_out(step, batch, lag_versions, updates_per_step, time.perf_counter() - t0)
                    self.dropped_batches += 1
                    self.dropped_samples += batch.batch_size
                    self._cond.notify_all()  # room freed: the producer may continue
                too_old = policy_version - self._version > self.max_age_steps * updates_per_step
                if too_old or (not self._busy and self._gated() and self._exclusive_owner is None):
                    raise StageOrderError(
                        f"no usable rollout can be produced: the generator holds policy version {self._version} "
                        f"(loaded at step {self._weights_step}), the policy is at version {policy_version} (step "
                        f"{step}), and data may be at most {self.max_age_steps} step(s) old; call session.refit() first")
                self._cond.wait(POLL_S)

    def _hand_out(self, step: int, batch: Trajectories, lag_versions: int, updates_per_step: int,
                  waited: float) -> Trajectories:
        lag_steps = math.ceil(lag_versions / max(updates_per_step, 1))
        self.lag_counts[lag_steps] += 1
        info = dict(batch.info, **{
            "timing/trainer_idle": waited,
            "timing/generator_idle": self._idle_since_handout,
            "rollout/policy_lag_steps": float(lag_steps),
            "rollout/queue_depth": float(len(self._ready)),
            "rollout/dropped_batches": float(self.dropped_batches),
            "rollout/dropped_samples": float(self.dropped_samples),
        })
        self._idle_since_handout = 0.0
        batch = batch.with_(info=info)
        self._current = (step, batch)
        return batch

    def weights_loaded(self, version: int, step: int) -> None:
        """The generator now holds policy ``version``, loaded after ``step`` completed RL steps."""
        with self._cond:
            self._version, self._weights_step = version, step
            self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the generator (for a refit or an evaluation): waits for the batch being sampled to finish,
        and keeps the producer from starting another. Re-entrant within one thread."""
        me = threading.get_ident()
        t0 = time.perf_counter()
        with self._cond:
            if self._exclusive_owner != me:
                self._exclusive_waiting += 1
                try:
                    while self._busy or self._exclusive_owner is not None:
                        self._cond.wait(POLL_S)
                finally:
                    self._exclusive_waiting -= 1
                self._exclusive_owner = me
                self.last_exclusive_wait = time.perf_counter() - t0
            self._exclusive_depth += 1
        try:
            yield
        finally:
            with self._cond:
                self._exclusive_depth -= 1
                if self._exclusive_depth == 0:
                    self._exclusive_owner = None
                self._cond.notify_all()

    # ---- producer side ----------------------------------------------------------------------------
    def _gated(self) -> bool:
        return self._next_target > self._weights_step + self.max_age_steps

    def _may_sample(self) -> bool:
        return not (self._stop or self._gated() or self._exclusive_owner is not None or self._exclusive_waiting)

    def _run(self) -> None:
        while True:
            t_idle = time.perf_counter()
            with self._cond:
                while not self._may_sample():
                    if self._stop:
                        return
                    self._cond.wait(POLL_S)
                self._idle_since_handout += time.perf_counter() - t_idle
                self._busy = True
                index, target, version = self._next_index, self._next_target, self._version
            try:
                batch = self.make_batch(index, version)
            except BaseException as e:  # noqa: BLE001 - handed to the trainer, which re-raises it
                with self._cond:
                    self._busy, self._error = False, e
                    self._cond.notify_all()
                return
            with self._cond:
                self._busy = False
                self._ready.append((target, batch))
                self._next_index, self._next_target = index + 1, max(self._next_target, target + 1)
                self._cond.notify_all()

    def _start_locked(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._stop = False
            self._thread = threading.Thread(target=self._run, name="rlkit-async-rollouts", daemon=True)
            self._thread.start()

    def _raise_producer_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error  # the producer thread has exited; the next batch_for_step starts a new one

    # ---- lifecycle and display ----------------------------------------------------------------------
    @property
    def ready(self) -> list[Trajectories]:
        """The batches sampled and waiting (oldest first)."""
        with self._cond:
            return [b for _, b in self._ready]

    def stats(self) -> dict[str, object]:
        with self._cond:
            return {
                "generator_version": self._version,
                "generator_weights_step": self._weights_step,
                "trainer_step": self._trainer_step,
                "ready_versions": [b.policy_version for _, b in self._ready],
                "sampling": self._busy,
                "lag_counts": dict(sorted(self.lag_counts.items())),
                "dropped_batches": self.dropped_batches,
                "dropped_samples": self.dropped_samples,
            }

    def close(self, timeout_s: float = 120.0) -> None:
        """Stop the producer after the batch it is sampling (if any) and drop the queue."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        with self._cond:
            self._ready.clear()
        self._current = None

    def __repr__(self) -> str:
        s = self.stats()
        behind = s["trainer_step"] - s["generator_weights_step"]
        return (f"AsyncRollouts(max_age={self.max_age_steps} step(s); generator holds version "
                f"{s['generator_version']}, {behind} step(s) behind the trainer; ready: versions "
                f"{s['ready_versions']}{' (+1 sampling)' if s['sampling'] else ''}; trained lags (steps): "
                f"{s['lag_counts']}; dropped {s['dropped_batches']} batch(es))")
