r"""Math answers checked with math-verify: reward 1.0 when the last ``\boxed{...}`` equals the row's answer.

Why the checks run in worker processes: math-verify parses LaTeX into sympy and compares symbolically, and a
policy can write answers that make that take forever (``\boxed{9^{9^{9^{9}}}}`` never finishes). math-verify's
own timeout uses ``signal.alarm``, which works only in the main thread (``step`` may run in a notebook
thread, a Ray actor or a rollout thread) and only to whole seconds. So each check runs in a small pool of
worker *processes*, and the parent kills a worker whose check passes ``timeout_seconds`` (any float) and
starts a fresh one: the sample gets reward 0 and a counted error, and the step never hangs, whatever thread
calls it. math-verify's signal timeouts are switched off inside the workers, since the kill is the limit.

The workers are fresh interpreters (``python -c <the source of _worker_main>``) that import math-verify
only, not rlkit or torch: they start fast, never inherit a CUDA context or threads through ``fork``, and
never re-run the user's script the way ``multiprocessing``'s spawn does for unguarded scripts. A timed-out
sample costs ``timeout_seconds`` plus a replacement's start, during which the other workers keep checking:
``num_workers=2`` (the default) is there so one stuck sample does not stall the batch.

Deliberate simplifications: only the last ``\boxed{...}`` counts (``\fbox`` and unbraced ``\boxed 5`` do not);
a completion without one gets 0 with no error (a format failure is a normal outcome, not a fault); a worker
left computing when the parent is SIGKILLed runs until its check ends (it exits at the next read).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import select
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any, Optional

from rlkit.envs.base import Conversation, Environment, EnvReturn, check_batch, completion_of, sample_error
from rlkit.errors import RewardError


def last_boxed(text: str) -> Optional[str]:
    r"""The content of the last ``\boxed{...}`` in ``text`` (braces balanced), or None if there is none."""
    start = text.rfind("\\boxed")
    while start != -1:
        i = start + len("\\boxed")
        while i < len(text) and text[i].isspace():
            i += 1
        if i < len(text) and text[i] == "{":
            depth = 0
            for j in range(i, len(text)):
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                if depth == 0:
                    return text[i + 1 : j]
        start = text.rfind("\\boxed", 0, start)
    return None


def _worker_main() -> None:  # pragma: no cover - runs in the worker process
    """The worker's whole program. Self-contained (its own imports): it is sent as source to ``python -c``."""
    import json
    import logging
    import os
    import sys
    import traceback

    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints from sympy or math-verify go to stderr, never into the protocol
    sys.stdout = sys.stderr
    try:
        from math_verify import LatexExtractionConfig, parse, verify
    except Exception:  # noqa: BLE001
        proto.write(json.dumps({"fatal": traceback.format_exc()}) + "\n")
        return
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled": the parent enforces it
    config = [LatexExtractionConfig()]
    proto.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        task = json.loads(line)
        try:
            answer = task["answer"]
            gold_text = answer if ("$" in answer or "\\boxed" in answer) else "$" + answer + "$"
            gold = parse(gold_text, extraction_config=config, parsing_timeout=None)
            if not gold:
                raise ValueError(f"math-verify cannot parse the reference answer {answer!r}")
            pred = parse("\\boxed{" + task["boxed"] + "}", extraction_config=config, parsing_timeout=None)
            reply = {"correct": bool(pred) and bool(verify(gold, pred, timeout_seconds=None))}
        except Exception as exc:  # noqa: BLE001
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        proto.write(json.dumps(reply) + "\n")


@dataclass(frozen=True)
class CheckOutcome:
    """The verdict on one boxed answer."""

    correct: bool
    error: Optional[str] = None  # set when the check failed or timed out
    timed_out: bool = False


class _Worker:
    """One checker process; at most one task in flight."""

    def __init__(self, source: str, startup_timeout: float):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", source], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        self.ready = False
        self.task: Optional[int] = None  # sample index being checked
        self.deadline = time.monotonic() + startup_timeout

    def send(self, index: int, boxed: str, answer: str, timeout: float) -> None:
        self.task, self.deadline = index, time.monotonic() + timeout
        self.proc.stdin.write(json.dumps({"boxed": boxed, "answer": answer}) + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()


def _kill_all(workers: list[_Worker]) -> None:
    for w in workers:
        w.kill()
    workers.clear()


class CheckerPool:
    """``num_workers`` checker processes with a hard per-check time limit. Safe to call from any thread."""

    def __init__(self, num_workers: int, timeout_seconds: float, startup_timeout_seconds: float = 60.0):
        self.num_workers, self.timeout, self.startup_timeout = num_workers, timeout_seconds, startup_timeout_seconds
        self._source = textwrap.dedent(inspect.getsource(_worker_main)) + "\n_worker_main()\n"
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _kill_all, self._workers)
        self.restarts = 0  # workers replaced after a timeout or a crash

    def check(self, tasks: list[tuple[int, str, str]]) -> dict[int, CheckOutcome]:
        """Check ``(sample index, boxed content, reference answer)`` triples; one outcome per index."""
        with self._lock:
            while len(self._workers) < self.num_workers:
                self._workers.append(_Worker(self._source, self.startup_timeout))
            try:
                return self._run(deque(tasks))
            except BaseException:
                # A failed start or a KeyboardInterrupt leaves replies in flight: start clean next time.
                _kill_all(self._workers)
                raise

    def _run(self, queue: deque[tuple[int, str, str]]) -> dict[int, CheckOutcome]:
        outcomes: dict[int, CheckOutcome] = {}
        while queue or any(w.task is not None for w in self._workers):
            for w in self._workers:
                if w.ready and w.task is None and queue:
                    w.send(*queue.popleft(), timeout=self.timeout)
            waiting = [w for w in self._workers if w.task is not None or not w.ready]
            wait = max(0.0, min(w.deadline for w in waiting) - time.monotonic())
            readable, _, _ = select.select([w.proc.stdout for w in waiting], [], [], wait)
            for w in waiting:
                if w.proc.stdout in readable:
                    self._receive(w, outcomes)
                elif time.monotonic() >= w.deadline:
                    self._expire(w, outcomes)
        return outcomes

    def _receive(self, w: _Worker, outcomes: dict[int, CheckOutcome]) -> None:
        line = w.proc.stdout.readline()
        reply = json.loads(line) if line else {"exited": w.proc.poll()}
        if not w.ready:
            if "ready" not in reply:
                detail = reply.get("fatal") or f"it exited with code {reply.get('exited')}"
                raise RewardError(f"the math checker process could not start: {detail}\n"
                                  "Install math-verify in this Python environment (pip install math-verify).")
            w.ready = True
            return
        index, w.task = w.task, None
        if "exited" in reply:
            outcomes[index] = CheckOutcome(False, f"checker process died (exit code {reply['exited']})")
            self._replace(w)
        elif "error" in reply:
            outcomes[index] = CheckOutcome(False, reply["error"])
        else:
            outcomes[index] = CheckOutcome(bool(reply["correct"]))

    def _expire(self, w: _Worker, outcomes: dict[int, CheckOutcome]) -> None:
        if not w.ready:
            raise RewardError(f"the math checker process did not start within {self.startup_timeout:g} s")
        outcomes[w.task] = CheckOutcome(
            False, f"TimeoutError: math-verify took longer than {self.timeout:g} s", timed_out=True
        )
        self._replace(w)

    def _replace(self, w: _Worker) -> None:
        w.kill()
        self._workers[self._workers.index(w)] = _Worker(self._source, self.startup_timeout)
        self.restarts += 1

    def close(self) -> None:
        with self._lock:
            _kill_all(self._workers)

    def __repr__(self) -> str:
        return f"CheckerPool(workers={len(self._workers)}/{self.num_workers}, timeout={self.timeout:g}s)"


class MathEnvironment(Environment):
    r"""Reward 1.0 when the last ``\boxed{...}`` of the completion is math-equivalent to ``row["answer"]``.

    ``row["answer"]`` is LaTeX or plain math (``"\frac{1}{2}"``, ``"0.5"``, ``"x+1"``); it is wrapped in
    ``$...$`` unless it already has ``$`` or ``\boxed``. Metadata per sample: ``extracted`` (the boxed text or
    None), ``correct`` (bool), ``timed_out`` (bool).
    """

    name = "math"

    def __init__(self, timeout_seconds: float = 5.0, num_workers: int = 2):
        if not timeout_seconds > 0 or num_workers < 1:
            raise ValueError(f"MathEnvironment needs timeout_seconds > 0 and num_workers >= 1, got "
                             f"{timeout_seconds!r} and {num_workers!r}")
        self.timeout_seconds, self.num_workers = float(timeout_seconds), num_workers
        self.pool = CheckerPool(num_workers, self.timeout_seconds)  # processes start on the first check

    def step(self, conversations: list[Conversation], rows: list[dict[str, Any]]) -> EnvReturn:
        check_batch(conversations, rows)
        extracted: list[Optional[str]] = [None] * len(rows)
        failures: dict[int, str] = {}
        tasks = []
        for i, (conversation, row) in enumerate(zip(conversations, rows)):
            try:
                extracted[i] = last_boxed(completion_of(conversation))
                if extracted[i] is not None:
                    tasks.append((i, extracted[i], str(row["answer"])))
            except Exception as exc:  # noqa: BLE001 - contained to this sample
                failures[i] = sample_error(i, exc)
        outcomes = self.pool.check(tasks)
        rewards, metadata, errors = [], [], []
        for i in range(len(rows)):
            outcome = outcomes.get(i, CheckOutcome(False))
            if i in failures:
                errors.append(failures[i])
            elif outcome.error is not None:
                errors.append(f"sample {i}: {outcome.error}")
            rewards.append(1.0 if outcome.correct else 0.0)
            metadata.append({"extracted": extracted[i], "correct": outcome.correct, "timed_out": outcome.timed_out})
        return EnvReturn.single_turn(rewards, metadata, errors)

    def close(self) -> None:
        self.pool.close()

    def __repr__(self) -> str:
        return f"MathEnvironment(timeout_seconds={self.timeout_seconds:g}, num_workers={self.num_workers})"
