"""What :mod:`rlkit.sandbox.run` asks of the kernel: the isolating command (``bwrap`` or ``unshare``), the
file system the program sees, and a cgroup per call for the total memory and number of processes.

The program sees a tmpfs root holding, read-only: ``/usr`` (with the host's ``/bin``, ``/lib``... links into
it), the interpreter's prefix (``sys.base_prefix``; the standard library, no site-packages), ``/etc/ld.so.cache``
and the devices ``null``, ``zero``, ``random``, ``urandom``; plus a fresh ``/proc`` of its PID namespace and a
small writable tmpfs ``/tmp`` holding its working directory ``/tmp/rlkit-sandbox``. Nothing else of the host: not the project, the data, the
home directory, ``/dev/shm``, ``/run`` or the host's ``/proc``.

Cgroups: where this process may create cgroups (cgroup v1 ``memory`` and ``pids`` hierarchies writable, as for
root in a container; or a delegated cgroup v2 subtree), each call gets one with ``memory_mb`` for all its
processes together and ``max_processes``; elsewhere the bounds are per process (``RLIMIT_AS`` and
``RLIMIT_NPROC``, which the kernel does not apply to a process of the host's root user).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Literal, Optional

SandboxMode = Literal["auto", "bwrap", "unshare", "unsafe-process"]
Backend = Literal["bwrap", "unshare", "unsafe-process"]
# the child side as a module, not ``-c`` source: its bytecode comes from __pycache__ instead of a compile per call
_CHILD = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import child; "
          "del sys.path[0]; child.main()")
_DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
_counter = itertools.count()
_STALE: list[str] = []  # cgroups whose processes were still exiting when their call ended
WORKDIR = "/tmp/rlkit-sandbox"  # the program's working directory, HOME and TMPDIR, in the tmpfs /tmp


def interpreter() -> str:
    """The program's interpreter: this Python's real binary (a virtual environment's link resolved)."""
    return os.path.realpath(sys.executable)


@lru_cache(maxsize=1)
def filesystem() -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    """``(symlinks, binds)`` of the program's root: ``(link, target)`` and ``(host path, path inside)``."""
    symlinks, binds = [], [("/usr", "/usr")]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            symlinks.append((top, os.readlink(top)))
        elif os.path.isdir(top):
            binds.append((top, top))
    prefix = os.path.realpath(sys.base_prefix)
    if not prefix.startswith("/usr/"):
        binds.append((prefix, prefix))
    binds += [(p, p) for p in ("/etc/ld.so.cache", *_DEVICES) if os.path.exists(p)]
    return tuple(symlinks), tuple(binds)


def command(backend: Backend, tmp: str, child_config: dict) -> tuple[list[str], dict]:
    """The argv that starts the child side in ``backend``, and the child's config completed for it."""
    python = [interpreter(), "-I", "-S", "-c", _CHILD]
    symlinks, binds = filesystem()
    config = dict(child_config, program=os.path.join(tmp, "program.py"), build_root=False, workdir=WORKDIR,
                  mountpoint=os.path.join(tmp, "root"), symlinks=symlinks, binds=binds, new_session=True)
    if backend == "unshare":
        config["build_root"] = True
        prefix = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--kill-child", "--mount", "--net",
                  "--ipc", "--uts"]
    elif backend == "bwrap":
        prefix = ["bwrap", "--unshare-all", "--unshare-user", "--die-with-parent", "--cap-drop", "ALL", "--as-pid-1"]
        for link, target in symlinks:
            prefix += ["--symlink", target, link]
        for source, target in binds:
            prefix += ["--dev-bind" if target in _DEVICES else "--ro-bind", source, target]
        prefix += ["--ro-bind", config["program"], "/program.py", "--proc", "/proc",
                   "--size", str(child_config["tmp_kb"] * 1024), "--tmpfs", "/tmp", "--dir", WORKDIR, "--remount-ro", "/",
                   "--chdir", WORKDIR]
        config["program"] = "/program.py"
    else:  # unsafe-process: no namespace; the program's working directory is a host temp dir
        config.update(workdir=os.path.join(tmp, "work"), new_session=False)
        os.mkdir(config["workdir"])
        prefix = []
    return prefix + python + [repr(config)], config


@dataclass
class CallCgroups:
    """The cgroups of one call: folders, and their open ``cgroup.procs`` files."""

    paths: list[str] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)

    def join(self, pid: int) -> bool:
        """Move process ``pid`` into the cgroups (its children from then on are born in them)."""
        try:
            for fd in self.fds:
                os.write(fd, str(pid).encode())
            return True
        except OSError:
            return False

    def close_fds(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def hit_memory_limit(self) -> bool:
        """True when the call's processes reached the memory cgroup's limit (v1 ``failcnt``, v2 ``oom_kill``)."""
        for path in self.paths:
            for name, test in (("memory.failcnt", lambda t: int(t) > 0),
                               ("memory.events", lambda t: " 0" not in t.split("oom_kill")[-1][:3])):
                with contextlib.suppress(OSError, ValueError):
                    if test(Path(path, name).read_text()):
                        return True
        return False

    def remove(self, deadline_s: float = 2.0) -> None:
        """Kill whatever is left in the cgroups, then remove them (retrying while the kernel tears down)."""
        self.close_fds()
        end = time.monotonic() + deadline_s
        for path in self.paths:
            while True:
                try:
                    for pid in Path(path, "cgroup.procs").read_text().split():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(int(pid), signal.SIGKILL)
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > end:
                        _STALE.append(path)  # its processes still exiting: removed by a later call
                        break
                    time.sleep(0.005)


def first_child(pid: int, deadline: float) -> Optional[int]:
    """The first child of process ``pid`` (the namespace's init under ``unshare`` or ``bwrap``), waiting for it
    until ``deadline`` (``time.monotonic``); None if ``pid`` ends or the deadline passes first."""
    path = f"/proc/{pid}/task/{pid}/children"
    while time.monotonic() < deadline:
        try:
            children = Path(path).read_text().split()
        except OSError:
            return None
        if children:
            return int(children[0])
        time.sleep(0.0005)
    return None


def _own_cgroup(controller: str) -> Optional[str]:
    """The folder of this process's cgroup for ``controller`` (v1), or of its v2 cgroup (``controller=""``)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(",") or (controller == "" and controllers == ""):
            root = f"/sys/fs/cgroup/{controller}" if controller else "/sys/fs/cgroup/unified"
            root = root if os.path.isdir(root) or controller else "/sys/fs/cgroup"
            return root + path.rstrip("/")
    return None


def make_cgroups(memory_bytes: int, max_processes: int) -> Optional[CallCgroups]:
    """A memory and a pids cgroup for one call, or None where this process may not make them."""
    name = f"rlkit-sandbox-{os.getpid()}-{next(_counter)}-{os.urandom(4).hex()}"  # pids repeat across namespaces
    plans = []
    memory, pids = _own_cgroup("memory"), _own_cgroup("pids")
    if memory and pids:  # cgroup v1
        plans = [(f"{memory}/{name}", "memory.limit_in_bytes", memory_bytes), (f"{pids}/{name}", "pids.max", max_processes)]
    elif (unified := _own_cgroup("")) is not None:
        plans = [(f"{unified}/{name}", "memory.max", memory_bytes), (f"{unified}/{name}", "pids.max", max_processes)]
    stale, _STALE[:] = list(_STALE), []
    CallCgroups(paths=stale).remove(deadline_s=0.0)  # what still fails goes back on the list
    cgroups = CallCgroups()
    try:
        for path, key, value in plans:
            if path not in cgroups.paths:
                os.mkdir(path)
                cgroups.paths.append(path)
            Path(path, key).write_text(str(value))
        for path in cgroups.paths:
            cgroups.fds.append(os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC))
    except OSError:
        cgroups.remove()
        return None
    return cgroups if plans else None


@lru_cache(maxsize=1)
def cgroups_available() -> bool:
    """True when calls get their own memory and pids cgroups here (see the module docstring)."""
    for parent in {p for p in (_own_cgroup("memory"), _own_cgroup("pids"), _own_cgroup("")) if p}:
        for path in Path(parent).glob("rlkit-sandbox-*"):  # left by ended processes (an exit during a teardown)
            with contextlib.suppress(OSError):
                if time.time() - path.stat().st_mtime > 60 and not (path / "cgroup.procs").read_text().strip():
                    path.rmdir()
    cgroups = make_cgroups(64 * 2**20, 4)
    if cgroups is None:
        return False
    cgroups.remove()
    return True
