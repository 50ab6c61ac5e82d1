"""Typed exceptions for user-facing problems. Each message says what is wrong and how to fix it; and how a stop
(Ctrl-C, Jupyter's stop button) is held over a block that must not be cut short."""

import contextlib
import difflib
import signal
import threading
from typing import Any

from rlkit.notebook.ipython import render_error


class RLKitError(Exception):
    """Base class of every error rlkit raises on purpose."""

    def _render_traceback_(self) -> list[str]:
        """IPython's hook: show the message, not rlkit's internal traceback (``%xmode verbose`` shows it);
        see :mod:`rlkit.notebook.ipython`."""
        return render_error(self)


class ConfigError(RLKitError, ValueError):
    """One or more configuration problems, all reported together before anything heavy starts."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{len(self.problems)} configuration problem(s):\n{lines}")


def describe_invalid(error: dict, prefix: tuple = (), root: Any = None) -> str:
    """One pydantic validation ``error`` as a config problem: its dotted key (``prefix`` + the error's location),
    and for an unknown key the nearest known one of the class that owns it (``root``, the validated type, walked
    along the location)."""
    loc = tuple(p for p in error["loc"] if isinstance(p, str) and not p.startswith(("literal[", "callable")))
    key = ".".join(map(str, prefix + loc))
    if error["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
        section = root  # a pydantic model, a dataclass, or None once the walk leaves them
        for part in loc[:-1]:
            fields = getattr(section, "model_fields", None) or {}
            section = (fields[part].annotation if part in fields
                       else getattr(section, "__dataclass_fields__", {}).get(part, None))
            section = getattr(section, "type", section)
        known = list(getattr(section, "model_fields", None) or getattr(section, "__dataclass_fields__", {}))
        hint = difflib.get_close_matches(str(loc[-1]), known, n=1)
        return f"{key}: unknown key" + (f"; did you mean {'.'.join(map(str, prefix + loc[:-1] + (hint[0],)))}?"
                                        if hint else "") + (f" (known here: {', '.join(known)})" if known else "")
    return f"{key}: {error['msg']} (got {error.get('input')!r})"


class DataError(ConfigError):
    """A data file that cannot be read as prompts (bad encoding, bad JSON, a truncated parquet file, a row
    without a prompt, an over-long prompt). Each problem names the file and the row. A ``ConfigError``,
    because the fix is a file that ``data.path`` names, and callers that catch config problems catch it."""


class StageOrderError(RLKitError, RuntimeError):
    """A stage was called before the stage that produces its input."""


class SessionClosedError(RLKitError, RuntimeError):
    """A stage or method of a Session called after its ``close()``: its engines are released."""


class ModelError(RLKitError, ValueError):
    """A model folder, architecture or tokenizer that rlkit cannot use as asked."""


class RewardError(RLKitError, RuntimeError):
    """A reward function failed in a way that cannot be contained to single samples."""


class CheckpointError(RLKitError, RuntimeError):
    """A checkpoint that cannot be written or read as asked."""


class SkippedStepsError(RLKitError, FloatingPointError):
    """Too many RL steps in a row had non-finite gradients (``grpo.max_consecutive_skipped_steps``); each was
    skipped with weights unchanged, and the run stopped. A ``FloatingPointError``, as a single refused update is."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or Jupyter's stop button during ``Session.run()``, after the session was left consistent: the
    message says after which step it stopped and that the finished steps are in ``session.history``. A
    KeyboardInterrupt, so a script still stops; in IPython it shows as that one line instead of a traceback
    through vLLM and oneDNN (``%xmode verbose`` shows the traceback)."""

    def _render_traceback_(self) -> list[str]:
        return render_error(self, hint=False)


@contextlib.contextmanager
def defer_keyboard_interrupt():
    """Hold a Ctrl-C / Jupyter stop until the block ends, then raise it: for work that a stop would leave half
    done and unusable (an optimizer update half applied, a vLLM weight load with its layers half swapped out).
    Outside the main thread (where no signal arrives) the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = signal.signal(signal.SIGINT, lambda *args: received.append(args))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            raise KeyboardInterrupt


class RunFolderError(RLKitError, OSError):
    """A run folder that cannot be used as asked: another process holds it (its lock names the holder), or it
    cannot be written (read-only, a full disk). The message names the path and the fix."""
