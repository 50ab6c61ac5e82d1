"""Quiet engine start: the third-party notices rlkit knows to be harmless, held back while it builds engines.

Why: starting a session imports Megatron-Core and starts vLLM, which print ~35 lines (Apex/Transformer Engine
missing, vLLM's notes on seeds, eager mode, Triton, LD_PRELOAD, thread counts, a NUMA binding note, torch
deprecations, a weight-loading bar). On a CPU machine every one of them is expected, and together they bury
the one line that matters: rlkit's own warning. So :func:`quiet_engine_start` wraps the engine builds and
drops exactly the notices listed below, and nothing else:

- Python warnings (:data:`KNOWN_WARNINGS`, by category, module and message). Every other warning raised while
  the engines start is recorded and shown after them, as it would have been (rlkit's own, in the session
  card too).
- vLLM's log records (:data:`KNOWN_LOG_RECORDS`, by logger and message), by a filter on those loggers.
- Lines written straight to the process's stdout/stderr by C++ code (:data:`KNOWN_FD_LINES`: vLLM's CPU
  extension warns about NUMA binding through torch's C++ warning handler, bypassing Python). Those file
  descriptors are redirected to a temporary file while the engines start; every other line is written back
  to ``sys.stdout`` / ``sys.stderr`` afterwards, so it reaches the notebook as before, a little later.
- Progress bars: transformers' (writing a new model folder), HF datasets' (``Generating train split`` while the
  prompt data loads; a notebook's stderr is not the file descriptor, so the redirection above misses them) and
  vLLM's weight-loading bar (the generator asks vLLM for none while :func:`quieted` is true). Your own setting of
  the first two is back when the block ends.

Scope: only while a session builds its engines (``Session.__init__``, so also ``Session.load``); the filters,
the redirection and the warning filters are all undone when the block ends, so later warnings from your own
code, from a stage, or from vLLM while it generates all show. ``Session(..., verbose=True)`` filters nothing.

Deliberate simplifications, and what is not covered: a vLLM engine in a Ray actor
(``policy.generation.colocated.enabled=false``) and Ray workers log through Ray's own forwarding, which this does
not touch; vLLM's INFO lines are already off by rlkit's default ``VLLM_LOGGING_LEVEL=WARNING`` (set it to INFO to
see them). If a dependency changes a message, the notice shows again (and ``tests/test_quiet.py`` counts lines).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import re
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator

from transformers.utils import logging as hf_logging

# (category, module regex, message regex): harmless on the machines rlkit runs on
KNOWN_WARNINGS: tuple[tuple[type[Warning], str, str], ...] = (
    (UserWarning, r"megatron\.", r"(Transformer Engine and )?Apex (is|are) not installed"),  # CPU: torch kernels
    (UserWarning, r"megatron\.", r"full scope is deprecated"),  # Megatron's own default config
    (FutureWarning, r"vllm\.", r"`torch\.distributed\.reduce_op` is deprecated"),  # vLLM inspects torch modules
)

# logger -> message regexes: vLLM's start-up notes about a CPU machine without Triton, tcmalloc or compilation
KNOWN_LOG_RECORDS: dict[str, tuple[str, ...]] = {
    "vllm.engine.arg_utils": (r"The global random seed is set to",),  # rlkit seeds on purpose
    "vllm.config.vllm": (r"Enforce eager set", r"Inductor compilation was disabled",
                         r"Model Runner V2 requires Triton"),  # rlkit's enforce_eager default
    "vllm.platforms.cpu": (r"Triton is not installed", r"Reset SSM cache type"),
    "vllm.triton_utils.importing": (r"Triton is installed, but doesn't include CPU backend",),
    "vllm.v1.worker.cpu_worker": (r"is not found in LD_PRELOAD", r"doesn't allow to use `torch\.set_num_threads`"),
    "vllm.utils.torch_utils": (r"OMP_NUM_THREADS=\d+ is set; leaving Torch threads",),
    # a second engine in the same process (a new session after close(), Session.load): vLLM's CPU worker set
    # VLLM_DIST_IDENT itself for the first engine, and its kernel overrides register again
    "vllm.platforms.interface": (r"Unknown vLLM environment variable detected: VLLM_DIST_IDENT$",),
    "vllm.triton_utils.dispatcher": (r"Kernel \S+ is already registered\. Overwriting\.",),
}

# lines C++ code writes to file descriptors 1/2 directly
KNOWN_FD_LINES: tuple[str, ...] = (
    r"Warning: NUMA binding: Using MEMBIND policy",  # vLLM's CPU extension (init_cpu_memory_env)
    r"Loading safetensors checkpoint shards",  # vLLM's bar, should a caller not ask for it off
)

_QUIET = contextvars.ContextVar("rlkit_quiet_engine_start", default=False)


def quieted() -> bool:
    """True inside :func:`quiet_engine_start` (not verbose): engines then start without progress bars."""
    return _QUIET.get()


@dataclass
class Held:
    """What a quiet start held back: counts of dropped notices, and the warnings it showed afterwards."""

    dropped: int = 0  # known notices not shown (warnings, log records, C++ lines)
    shown: list[warnings.WarningMessage] = field(default_factory=list)  # every other warning, shown at the end


def known_warning(w: warnings.WarningMessage) -> bool:
    """Whether a recorded warning is on :data:`KNOWN_WARNINGS` (its module is read from its file name)."""
    module = _module_of(w.filename)
    return any(issubclass(w.category, category) and re.match(mod, module) and re.search(msg, str(w.message))
               for category, mod, msg in KNOWN_WARNINGS)


def _module_of(filename: str) -> str:
    """``.../site-packages/megatron/core/optimizer/__init__.py`` -> ``megatron.core.optimizer.__init__``."""
    path = filename.replace(os.sep, "/")
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return path.removesuffix(".py").replace("/", ".")


class _KnownRecords(logging.Filter):
    """Drops the records of one logger whose message matches one of ``patterns``; counts them."""

    def __init__(self, patterns: tuple[str, ...], held: Held):
        super().__init__()
        self.patterns, self.held = [re.compile(p) for p in patterns], held

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR and any(p.search(record.getMessage()) for p in self.patterns):
            self.held.dropped += 1
            return False
        return True


@contextlib.contextmanager
def _known_log_records_dropped(held: Held) -> Iterator[None]:
    with contextlib.ExitStack() as installed:
        for name, patterns in KNOWN_LOG_RECORDS.items():
            # getLogger creates the logger if vLLM is not imported yet; vLLM's init_logger then returns this object
            logger, known = logging.getLogger(name), _KnownRecords(patterns, held)
            logger.addFilter(known)
            installed.callback(logger.removeFilter, known)
        yield


@contextlib.contextmanager
def sorted_warnings(held: Held) -> Iterator[Held]:
    """Record the warnings raised in the block (your warning filters still apply); when it ends, even by an
    exception, show every one that is not on :data:`KNOWN_WARNINGS` (``held.shown``) and count the others."""
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            yield held
    finally:
        for w in caught:
            if known_warning(w):
                held.dropped += 1
                continue
            held.shown.append(w)
            warnings.showwarning(w.message, w.category, w.filename, w.lineno, w.file, w.line)


@contextlib.contextmanager
def _known_fd_lines_dropped(held: Held) -> Iterator[None]:
    """Redirect file descriptors 1 and 2 to temporary files; afterwards write back every unknown line (to
    ``sys.stdout`` / ``sys.stderr``, so a notebook shows it) and count the known ones."""
    streams = {1: sys.stdout, 2: sys.stderr}
    _flush(*streams.values(), sys.__stdout__, sys.__stderr__)
    saved = {fd: os.dup(fd) for fd in streams}
    captures = {fd: tempfile.TemporaryFile() for fd in streams}
    try:
        for fd, capture in captures.items():
            os.dup2(capture.fileno(), fd)
        yield
    finally:
        _flush(sys.__stdout__, sys.__stderr__)  # a terminal's Python streams write to these fds
        for fd in streams:
            os.dup2(saved[fd], fd)
            os.close(saved[fd])
        for fd, capture in captures.items():
            capture.seek(0)
            lines = capture.read().decode("utf-8", errors="replace").splitlines(keepends=True)
            capture.close()
            known = [any(re.search(p, line) for p in KNOWN_FD_LINES) for line in lines]
            held.dropped += sum(bool(line.strip()) for line, k in zip(lines, known) if k)
            kept = [line for line, k in zip(lines, known) if not k]
            if kept:
                streams[fd].write("".join(kept))
                streams[fd].flush()


def _flush(*streams: object) -> None:
    for stream in streams:
        with contextlib.suppress(Exception):
            stream.flush()


@contextlib.contextmanager
def _progress_bars_off(library: Any) -> Iterator[None]:
    """A library's progress bars off in the block, the user's setting after. ``library``: transformers' logging
    (bars while writing a model folder) or ``datasets`` ("Generating train split" while the data loads): both
    have these three switches."""
    was_enabled = library.is_progress_bar_enabled()
    library.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            library.enable_progress_bar()


@contextlib.contextmanager
def quiet_engine_start(verbose: bool = False) -> Iterator[Held]:
    """Hold back the known notices while the block builds engines (see the module docstring); yields what
    was held. ``verbose``: hold back nothing."""
    held = Held()
    if verbose:
        yield held
        return
    import datasets  # (rlkit.data imports it anyway)

    token = _QUIET.set(True)
    try:
        with sorted_warnings(held), _known_log_records_dropped(held), _known_fd_lines_dropped(held), \
                _progress_bars_off(hf_logging), _progress_bars_off(datasets):
            yield held
    finally:
        _QUIET.reset(token)
