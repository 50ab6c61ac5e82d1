"""Run untrusted Python (a policy's tool call) so that one line of it cannot stop the run, forge a reward or
read a secret.

Under RL a policy is rewarded for whatever works, so the boundary is the kernel's, not Python's. Each call runs
in new user, PID, mount, network, IPC and UTS namespaces, through ``bwrap`` when it is installed and through
util-linux's ``unshare`` otherwise (:mod:`rlkit.sandbox.kernel`, :mod:`rlkit.sandbox.child`).
Which guarantee comes from where:

- **the trainer and every other process are out of reach** (no signal, no ``ptrace``, no ``/proc/<pid>``): the
  PID namespace and a fresh ``/proc`` of it;
- **nothing outside is written, and the project, data, home directory and the host's ``/proc`` are not even
  visible**: the mount namespace, whose root is a tmpfs holding read-only binds of ``/usr`` and the
  interpreter's prefix only, and a small writable tmpfs ``/tmp`` thrown away with the call; every capability
  is dropped, so the program cannot remount anything;
- **no network, not even loopback; no Unix socket of the host**: the network namespace (abstract sockets are
  scoped to it too) and the mount namespace (socket files are not visible);
- **no process outlives the call**: its first process is the namespace's PID 1, and when it ends the kernel
  kills every process left in the namespace (``setsid`` and double forks included); the parent also kills it
  at the wall limit;
- **time, CPU, memory, processes, output**: the wall clock is the parent's (``wall_seconds`` from the
  program's start; the interpreter's start-up is allowed ``startup_seconds`` apart); ``RLIMIT_CPU``,
  ``RLIMIT_AS``, ``RLIMIT_FSIZE`` and ``RLIMIT_NPROC`` per process; where cgroups can be made (see
  :mod:`rlkit.sandbox.kernel`), ``memory_mb`` and ``max_processes`` bound all the call's processes
  together; output goes to a pipe the parent owns and reads at most ``max_file_bytes`` of;
- **clear messages for an honest program's mistakes** (writing outside the temp dir, starting a process,
  opening a socket): an audit hook, the second guard only; a program can get around it, not around the above.

Without user namespaces (many Docker and Kubernetes pods) neither backend works, and the Python tool is
refused (:class:`SandboxUnavailableError`) unless ``PythonTool(sandbox="unsafe-process")`` asks
for a plain process: then only the resource limits, the cgroups where available, the dropped capabilities and
the audit hook remain, and a warning names what is lost. Never a silent downgrade.

Whatever the program does, :func:`run_python` returns a :class:`SandboxResult`: it never raises and never
waits longer than ``startup_seconds + wall_seconds`` plus the teardown.

Deliberate simplifications: no seccomp filter (the program may make any system call its namespaces allow);
the kernel's own attack surface is in reach, as in every container; ``bench/sandbox_call.py`` measures the
per-call cost.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

from rlkit.sandbox.kernel import Backend, SandboxMode, cgroups_available, command, first_child, make_cgroups
from rlkit.errors import RLKitError

UNSAFE_LOSSES = ("the trainer and every process of its user can be signalled (killed, stopped)",
                 "every file the user can read is readable (the dataset's answers, the project, secrets in "
                 "/proc/<pid>/environ); writes outside the temp dir are stopped only by the audit hook",
                 "loopback and Unix-socket network access; processes outlive the call unless cgroups are available")


class SandboxUnavailableError(RLKitError):
    """No kernel sandbox works here and the user did not opt in to running programs without one."""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run."""

    wall_seconds: float = 2.0  # the call is killed this long after the program starts
    startup_seconds: float = 30.0  # allowed for the sandbox and interpreter to start, apart from wall_seconds
    cpu_seconds: int = 2  # RLIMIT_CPU (whole seconds), per process
    memory_mb: int = 512  # RLIMIT_AS per process; all the call's processes together where cgroups exist
    max_processes: int = 16  # RLIMIT_NPROC; the call's pids cgroup where cgroups exist
    max_file_bytes: int = 1_000_000  # output read from the pipe, and RLIMIT_FSIZE for files in /tmp
    tmp_mb: int = 16  # size of the writable tmpfs /tmp (namespace backends)
    max_output_chars: int = 200  # of stdout + stderr returned


@dataclass(frozen=True)
class SandboxResult:
    """What a sandboxed program printed, and whether it ended normally."""

    output: str  # at most max_output_chars of stdout + stderr ("... [truncated]" appended when cut)
    ok: bool  # exit status 0 within the limits
    reason: str  # "ok", "timeout", "exit <code>", "killed by <signal>", "refused: ...", "sandbox error: ..."
    seconds: float  # the whole call
    startup_seconds: float = 0.0  # of which before the program started (sandbox set-up, interpreter start-up)


def run_python(code: str, limits: SandboxLimits = SandboxLimits(), sandbox: SandboxMode = "auto") -> SandboxResult:
    """Run ``code`` in a fresh interpreter under ``limits`` in the ``sandbox`` backend; see the module docstring."""
    try:
        backend = resolve_backend(sandbox)
    except SandboxUnavailableError as exc:
        return SandboxResult("", False, f"refused: {exc}", 0.0)
    return run_in(backend, code, limits)


def resolve_backend(sandbox: SandboxMode = "auto") -> Backend:
    """The backend ``sandbox`` runs in here; raises :class:`SandboxUnavailableError` (cause and fix) if none."""
    if sandbox == "unsafe-process":
        _warn_unsafe()
        return "unsafe-process"
    wanted: tuple[Backend, ...] = ("bwrap", "unshare") if sandbox == "auto" else (sandbox,)
    problems = [f"{b}: {why}" for b in wanted if (why := backend_problem(b))]
    for backend in wanted:
        if not backend_problem(backend):
            return backend
    raise SandboxUnavailableError(
        f"no kernel sandbox for the Python tool here ({'; '.join(problems)}). It needs unprivileged user "
        f"namespaces (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0; in Docker, a "
        f"seccomp profile that allows unshare/clone) and util-linux's unshare or bubblewrap. To run programs "
        f"without one, make the tool with PythonTool(sandbox='unsafe-process'); lost then: "
        + "; ".join(UNSAFE_LOSSES))


@lru_cache(maxsize=None)
def backend_problem(backend: Backend) -> str:
    """``""`` when ``backend`` runs a program here, else why not (one probe, cached for the process)."""
    if backend != "unsafe-process" and shutil.which(backend) is None:
        return f"{backend} is not installed"
    probe = run_in(backend, "print(6 * 7)", SandboxLimits(wall_seconds=10.0))
    return "" if probe.output == "42\n" else f"failed here: {probe.reason}: {probe.output.strip()[-300:]}"


def describe_backend(sandbox: SandboxMode = "auto") -> str:
    """One line: the backend ``sandbox`` uses here and whether calls get cgroups."""
    try:
        backend = resolve_backend(sandbox)
    except SandboxUnavailableError as exc:
        return f"none ({exc})"
    return f"{backend}, " + ("memory and pids cgroup per call" if cgroups_available() else "per-process rlimits only")


@lru_cache(maxsize=1)
def _warn_unsafe() -> None:
    warnings.warn("PythonTool(sandbox='unsafe-process'): Python tool calls run as plain processes, without a kernel "
                  "sandbox. Lost: " + "; ".join(UNSAFE_LOSSES), RuntimeWarning, stacklevel=3)


def run_in(backend: Backend, code: str, limits: SandboxLimits) -> SandboxResult:
    """:func:`run_python` in a given backend, without checking that it works here."""
    t0 = time.perf_counter()
    tmp, proc, cgroups, fds, joiner = tempfile.mkdtemp(prefix="rlkit-sandbox-"), None, None, [], None
    output, total, reason, startup = b"", 0, "", 0.0
    try:
        Path(tmp, "program.py").write_bytes(code.encode("utf-8", errors="replace"))
        os.mkdir(os.path.join(tmp, "root"))
        if cgroups_available():
            cgroups = make_cgroups(limits.memory_mb * 2**20, limits.max_processes + 1)  # + the namespace's init
            if cgroups is None:  # they worked in this process before: no silent run without them
                raise OSError("the call's cgroups could not be made")
        out_r, out_w = os.pipe()
        status_r, status_w = os.pipe()
        go_r, go_w = os.pipe() if cgroups else (None, None)
        fds = [fd for fd in (out_r, out_w, status_r, status_w, go_r, go_w) if fd is not None]
        config = {"status_fd": status_w, "go_fd": go_r, "tmp_kb": limits.tmp_mb * 1024, "rlimits": _rlimits(limits)}
        argv, config = command(backend, tmp, config)
        home = config["workdir"]
        proc = subprocess.Popen(argv, cwd=tmp, stdin=subprocess.DEVNULL, stdout=out_w, stderr=out_w,
                                env={"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LC_ALL": "C.UTF-8"},
                                start_new_session=True, pass_fds=tuple(fd for fd in (status_w, go_r) if fd is not None))
        for fd in (out_w, status_w, go_r):
            if fd is not None:
                os.close(fd)
                fds.remove(fd)
        if cgroups:  # moved while its interpreter starts; it starts the program only after this
            fds.remove(go_w)
            joiner = threading.Thread(target=_join, args=(cgroups, proc.pid, backend, go_w, t0 + limits.startup_seconds),
                                      daemon=True)
            joiner.start()
        output, total, reason, startup = _watch(out_r, status_r, limits, t0)
    except Exception as exc:  # noqa: BLE001 - run_python never raises on the program's behalf
        reason = f"sandbox error: {type(exc).__name__}: {exc}"
    finally:
        reason = _teardown(proc, cgroups, joiner, fds, reason)
        shutil.rmtree(tmp, ignore_errors=True)
    return SandboxResult(_head(output, total, limits.max_output_chars), reason == "ok", reason, time.perf_counter() - t0,
                         startup)


def _join(cgroups, pid: int, backend: Backend, go_w: int, deadline: float) -> None:
    """Move the call's first process inside the namespaces into its cgroups, then tell it to go on ("1") or not."""
    try:
        init = pid if backend == "unsafe-process" else first_child(pid, time.monotonic() + deadline - time.perf_counter())
        ok = init is not None and cgroups.join(init)
        os.write(go_w, b"1" if ok else b"0")
    except OSError:
        pass
    finally:
        os.close(go_w)
        cgroups.close_fds()


def _watch(out_r: int, status_r: int, limits: SandboxLimits, t0: float) -> tuple[bytes, int, str, float]:
    """Read the output and the status pipe until the call ends or a limit is hit: ``(output head, output bytes,
    reason, start-up seconds)``; reason ``""`` means the child's status pipe closed without a status (see teardown)."""
    deadline, started, startup = t0 + limits.startup_seconds, False, 0.0
    head, total, status, cap = bytearray(), 0, b"", limits.max_output_chars * 4 + 1  # utf-8: <= 4 bytes a char
    open_fds = {out_r, status_r}
    while open_fds:
        done = status.endswith(b"\n")  # the program has ended: take what is already in the pipe, then stop
        left = 0.0 if done else deadline - time.perf_counter()
        if left <= 0 and not done:
            why = "" if started else f" (the interpreter did not start in {limits.startup_seconds:g} s)"
            return bytes(head), total, "timeout" + why, startup or time.perf_counter() - t0
        ready = select.select(list(open_fds), [], [], left)[0]
        if done and not ready:
            break
        for fd in ready:
            data = os.read(fd, 65536)
            if not data:
                open_fds.discard(fd)
            elif fd == status_r:
                if not started:
                    started, startup = True, time.perf_counter() - t0
                    deadline = time.perf_counter() + limits.wall_seconds
                status = (status + data.lstrip(b"."))[:64]
            else:
                total += len(data)
                head += data[:max(0, cap - len(head))]
                if total > limits.max_file_bytes:
                    return bytes(head), total, f"killed: output over {limits.max_file_bytes} bytes", startup
    if not status.endswith(b"\n"):
        return bytes(head), total, "", startup
    code = os.waitstatus_to_exitcode(int(status))
    return bytes(head), total, "ok" if code == 0 else _exit_reason(code), startup


def _teardown(proc: Optional[subprocess.Popen], cgroups, joiner: Optional[threading.Thread], fds: list[int],
              reason: str) -> str:
    """Kill what is left of the call, reap it, close the pipes, remove the cgroups; the final reason."""
    if proc is not None:
        # after a normal end the isolating process exits by itself, its namespace torn down
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0 if reason and not reason.startswith(("timeout", "killed: output")) else 0.0)
        if proc.poll() is None:  # (once reaped, its pid may be another process's)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # the isolating process: its death ends the namespace
        try:
            code = proc.wait(timeout=5.0)
            if not reason:
                reason = f"the sandbox ended without the program's status ({_exit_reason(code) if code else 'exit 0'})"
        except subprocess.TimeoutExpired:
            reason = reason or "sandbox error: the sandbox did not end"
    if joiner is not None:
        joiner.join(timeout=5.0)  # done once the isolating process is gone (it finds no init then)
    if cgroups is not None:
        if reason == "killed by SIGKILL" and cgroups.hit_memory_limit():
            reason += " (memory limit)"
        cgroups.remove()
    for fd in fds:
        os.close(fd)
    return reason or "sandbox error: no status"


def _rlimits(limits: SandboxLimits) -> list[tuple[str, tuple[int, int]]]:
    """The program's resource limits (name in :mod:`resource`, (soft, hard)); anything it starts inherits them."""
    return [("RLIMIT_CPU", (limits.cpu_seconds, limits.cpu_seconds + 1)),
            ("RLIMIT_AS", (limits.memory_mb * 2**20,) * 2),
            ("RLIMIT_FSIZE", (limits.max_file_bytes,) * 2),
            ("RLIMIT_NPROC", (limits.max_processes,) * 2),
            ("RLIMIT_CORE", (0, 0))]


def _exit_reason(code: int) -> str:
    if code < 0:
        name = signal.Signals(-code).name
        hint = {"SIGXCPU": " (CPU time limit)", "SIGXFSZ": " (file size limit)"}.get(name, "")
        return f"killed by {name}{hint}"
    return f"exit {code}"


def _head(output: bytes, total: int, max_chars: int) -> str:
    text = output.decode("utf-8", errors="replace")
    if len(text) > max_chars or total > len(output):
        return text[:max_chars] + "... [truncated]"
    return text
