"""The step clock: every second of an RL step under a named ``timing/`` key, each measured once.

Why one clock: it times the parts of a step where the run does them (each stage method of
:class:`rlkit.run.run.Run`, dynamic sampling's extra rounds, metrics reduction, the progress bar, an evaluation
inside ``run()``, logging and checkpoint saves), and names the remainder; the stage functions write no ``timing/``
figure. A stage run cell by cell is timed on the run's cell clock, whose parts the next ``train()`` records.

How the parts add up: parts nest, and a part's seconds exclude the parts opened inside it (dynamic
sampling's scoring inside its rollout counts as ``score``, not twice), so the parts partition the step's wall
time and ``timing/other`` = ``timing/step_total`` - the sum of the parts is what no part covers. Only the thread
that opened the clock records: async GRPO's producer samples in its own thread, and that time is not this
step's (the step's wait for the batch is its ``rollout``).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Iterator, MutableMapping

# The parts of a step, in the order a step does them; they and ``other`` sum to ``timing/step_total``.
PARTS = ("refit", "rollout", "score", "logprobs", "reference_logprobs", "values", "teacher_logprobs", "advantages",
         "train", "critic", "metrics", "progress", "eval", "logging", "tables", "checkpoint", "listeners", "other")


class StepClock:
    """Wall-clock seconds per part of one step, from its creation to :meth:`finish`."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = defaultdict(float)
        self.samples = self.tokens = 0.0  # what the step trained on, for the throughput figures
        self._nested: list[float] = []  # seconds spent in parts opened inside each open part
        self._thread = threading.get_ident()

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Time the block as part ``name`` (one of :data:`PARTS`), less the parts opened inside it."""
        if threading.get_ident() != self._thread:
            yield
            return
        t0 = time.perf_counter()
        self._nested.append(0.0)
        try:
            yield
        finally:
            spent, inner = time.perf_counter() - t0, self._nested.pop()
            self.seconds[name] += spent - inner
            if self._nested:
                self._nested[-1] += spent

    def skipped(self, name: str) -> None:
        """Record part ``name`` at 0 s: a stage this step did not need, its column kept in every record."""
        self.seconds[name] += 0.0

    def finish(self, values: MutableMapping[str, float]) -> float:
        """Write the parts, ``timing/other``, ``timing/step_total`` and the throughput into ``values``; the total."""
        total = time.perf_counter() - self.start
        values.update({f"timing/{name}": s for name, s in self.seconds.items()})
        values["timing/other"] = total - sum(self.seconds.values())
        values["timing/step_total"] = total
        if self.samples:
            values["timing/samples_per_second"] = self.samples / total
            values["timing/tokens_per_second"] = self.tokens / total
        return total

    def add_to(self, values: MutableMapping[str, float]) -> None:
        """Add this clock's parts and seconds to a record ``finish`` already wrote (the last step of ``run()``:
        its listeners' seconds have no next record to go to)."""
        total = time.perf_counter() - self.start
        for name, s in self.seconds.items():
            values[f"timing/{name}"] = values.get(f"timing/{name}", 0.0) + s
        values["timing/other"] = values.get("timing/other", 0.0) + total - sum(self.seconds.values())
        before = values.get("timing/step_total", 0.0)
        values["timing/step_total"] = before + total
        for key in ("timing/samples_per_second", "timing/tokens_per_second"):  # per second of the whole step
            if key in values and before:
                values[key] *= before / (before + total)


def accounted(values: MutableMapping[str, float]) -> float:
    """The sum of a step record's parts (``other`` included): ``timing/step_total`` when every second is named."""
    return sum(values.get(f"timing/{name}", 0.0) for name in PARTS)
