"""Run untrusted Python (a policy's tool call) in a separate, limited process.

What a model writes in a ``<python>`` block is run by a fresh interpreter in its own process group:

- **wall time**: killed (the whole group) ``wall_seconds`` after the program starts; the interpreter's own
  start-up (~50 ms, seconds on a loaded machine) is allowed ``startup_seconds`` apart, so a busy machine
  does not time out a correct program before its first line;
- **CPU time and memory**: ``RLIMIT_CPU`` and ``RLIMIT_AS`` set by the child's first lines, before the user's
  code (not in a ``preexec_fn``: that forces a full ``fork`` of the parent, which in a process holding vLLM and
  the policy took seconds per call; without it Python starts the child by ``vfork``);
- **output**: stdout and stderr go to one file in a fresh temp dir whose size ``RLIMIT_FSIZE`` caps, so a
  program that prints megabytes is stopped by the kernel, not buffered by rlkit; the first ``max_output_chars``
  come back;
- **network**: the child runs in a new, empty network namespace (``unshare -rn``) where the machine allows
  unprivileged user namespaces; everywhere an audit hook also refuses sockets;
- **file system**: the working directory is the temp dir (deleted afterwards); the audit hook refuses opening
  files for writing, and removing or renaming files, outside it.

Whatever happens (a timeout, a crash, a limit), :func:`run_python` returns a :class:`SandboxResult` with a
short message; it never raises on the program's behalf and never waits past ``wall_seconds`` after the
program's start (plus the interpreter's start-up).

Deliberate simplifications: the audit hook is a Python-level guard (a C extension loaded by the program
could bypass it); the kernel-level guards are the resource limits and, where available, the network
namespace. No seccomp filter. For hostile code use a container; this is for a policy's mistakes.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# Runs inside the child before the user's code: the resource limits (``{limits}``, filled in per run), then
# confine writes to the temp dir, refuse sockets.
_GUARD = r'''
import os, resource, sys
for _limit, _value in {limits}:
    resource.setrlimit(getattr(resource, _limit), _value)
os.write({ready_fd}, b"."); os.close({ready_fd})  # the program starts now: the parent's wall clock begins
_root = os.path.realpath(os.getcwd())
def _inside(path):
    try:
        return os.path.realpath(os.fsdecode(path)).startswith(_root + os.sep)
    except Exception:
        return False
def _guard(event, args):
    if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        mode, flags = (args[1] or "r"), (args[2] or 0)
        writes = any(c in str(mode) for c in "wax+") or flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
        if writes and not _inside(args[0]):
            raise PermissionError(f"sandbox: writing outside the temp dir is not allowed: {args[0]}")
    elif event in ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "shutil.rmtree") and args:
        if not _inside(args[0]):
            raise PermissionError(f"sandbox: {event} outside the temp dir is not allowed: {args[0]}")
    elif event.startswith("socket.") or event in ("os.system", "subprocess.Popen", "os.exec", "os.posix_spawn"):
        raise PermissionError(f"sandbox: {event} is not allowed")
sys.addaudithook(_guard)
del _guard
_code = open("program.py").read()
exec(compile(_code, "<tool>", "exec"), {"__name__": "__main__"})
'''


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run."""

    wall_seconds: float = 2.0  # the whole process group is killed this long after the program starts
    startup_seconds: float = 30.0  # allowed for the interpreter to start, apart from wall_seconds
    cpu_seconds: int = 2  # RLIMIT_CPU (whole seconds)
    memory_mb: int = 512  # RLIMIT_AS
    max_file_bytes: int = 1_000_000  # RLIMIT_FSIZE: output file and any file written in the temp dir
    max_output_chars: int = 200  # of stdout + stderr returned


@dataclass(frozen=True)
class SandboxResult:
    """What a sandboxed program printed, and whether it ended normally."""

    output: str  # at most max_output_chars of stdout + stderr ("... [truncated]" appended when cut)
    ok: bool  # exit status 0 within the limits
    reason: str  # "ok", "timeout", "exit <code>", "killed by <signal>"
    seconds: float  # the whole call
    startup_seconds: float = 0.0  # of which before the program started (the interpreter's start-up)


@lru_cache(maxsize=1)
def network_namespace_available() -> bool:
    """True when ``unshare -rn`` works here (unprivileged user and network namespaces)."""
    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run ``code`` in a fresh interpreter under ``limits``; see the module docstring."""
    import time

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rlkit-sandbox-") as tmp:
        Path(tmp, "program.py").write_text(code)
        out_path = Path(tmp, "output.txt")
        ready, ready_in_child = os.pipe()  # the guard writes one byte when the program starts
        guard = _GUARD.replace("{limits}", repr(_rlimits(limits))).replace("{ready_fd}", str(ready_in_child))
        command = [sys.executable, "-I", "-S", "-c", guard]
        if network_namespace_available():
            command = ["unshare", "-rn", *command]
        with open(out_path, "wb") as out:
            try:
                child = subprocess.Popen(command, cwd=tmp, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, env={"PATH": "/usr/bin:/bin", "HOME": tmp,
                                                                        "TMPDIR": tmp},
                                         start_new_session=True, pass_fds=(ready_in_child,))
            finally:
                os.close(ready_in_child)
            try:
                started = select.select([ready], [], [], limits.startup_seconds)[0]  # (or ended: EOF)
                startup = time.perf_counter() - t0
                if not started:
                    raise subprocess.TimeoutExpired(command, limits.startup_seconds)
                code_ = child.wait(timeout=limits.wall_seconds)
                reason = "ok" if code_ == 0 else _exit_reason(code_)
            except subprocess.TimeoutExpired:
                _kill_group(child)
                reason = "timeout" if started else f"timeout (the interpreter did not start in {limits.startup_seconds:g} s)"
            finally:
                os.close(ready)
        output = _read_head(out_path, limits.max_output_chars)
    return SandboxResult(output, reason == "ok", reason, time.perf_counter() - t0, startup)


def _rlimits(limits: SandboxLimits) -> list[tuple[str, tuple[int, int]]]:
    """The child's resource limits (name in :mod:`resource`, (soft, hard)); anything it starts inherits them."""
    return [("RLIMIT_CPU", (limits.cpu_seconds, limits.cpu_seconds + 1)),
            ("RLIMIT_AS", (limits.memory_mb * 2**20,) * 2),
            ("RLIMIT_FSIZE", (limits.max_file_bytes,) * 2),
            ("RLIMIT_CORE", (0, 0))]


def _kill_group(child: subprocess.Popen) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    child.wait()


def _exit_reason(code: int) -> str:
    if code < 0:
        name = signal.Signals(-code).name
        hint = {"SIGXCPU": " (CPU time limit)", "SIGXFSZ": " (output size limit)", "SIGKILL": ""}.get(name, "")
        return f"killed by {name}{hint}"
    return f"exit {code}"


def _read_head(path: Path, max_chars: int) -> str:
    with open(path, "rb") as f:
        head = f.read(max_chars * 4 + 1)  # utf-8: at most 4 bytes a character
        more = f.read(1) != b""
    text = head.decode("utf-8", errors="replace")
    if len(text) > max_chars or more:
        return text[:max_chars] + "... [truncated]"
    return text
