"""One process per run folder: ``<run_dir>/.lock`` names its holder (pid, host, start time, command).

Why: two ``rlkit train`` processes with the same ``name=`` write the same folder; both exited 0, and one run
was lost (its metrics replaced, the checkpoints and summary.json the other's). The lock file is created with
``O_CREAT | O_EXCL`` (atomic on a local file system), so of two starts exactly one gets it; the other is refused
with a message naming the holder. A lock whose process is gone (same host, and that pid is not running or was
started after the lock) is stale: it is taken over, with a warning naming the process it belonged to.

Deliberate simplifications: a lock from another host is never judged stale (its pid means nothing here; the fix
is to delete the file once that run is known to be over); on a network file system ``O_EXCL`` may not be atomic.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Iterator, Optional

import psutil

from rlkit.errors import RunFolderError

LOCK_NAME = ".lock"


def _holder_text(holder: dict[str, Any]) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started", 0)))
    return f"pid {holder.get('pid')} on {holder.get('host')}, started {started} ({holder.get('command', '?')})"


def _alive(holder: dict[str, Any]) -> Optional[bool]:
    """Whether the lock's process still runs: None when that cannot be told here (another host)."""
    if holder.get("host") != socket.gethostname():
        return None
    try:
        process = psutil.Process(int(holder["pid"]))
        return process.create_time() <= float(holder.get("started", 0)) + 1.0  # a reused pid started later
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


def _age(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return float("inf")


def _read(path: Path) -> dict[str, Any]:
    try:
        holder = json.loads(path.read_text())
        return holder if isinstance(holder, dict) else {}
    except (OSError, ValueError):
        return {}  # half-written by a process that died at that instant: judged as a dead holder


@contextlib.contextmanager
def run_folder_lock(run_dir: str | Path) -> Iterator[Path]:
    """Hold ``run_dir``'s lock for the block; raise ``RunFolderError`` if a live process holds it."""
    run_dir = Path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise unwritable(e, run_dir) from e
    path = run_dir / LOCK_NAME
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
          "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:200] if sys.argv else "?"}
    for _ in range(10):  # another process may take a stale lock at the same instant: try again
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _read(path)
            if not holder and _age(path) < 5.0:  # being written by the process that just created it
                time.sleep(0.2)
                continue
            alive = _alive(holder) if holder else False
            if alive is not False:
                raise RunFolderError(
                    f"run folder {str(run_dir)!r} is in use by another run: {_holder_text(holder)}. A second run with "
                    "the same name would overwrite its records. Fix: give this run another name (name=...), wait "
                    f"for that run to end, or, if it is no longer running{' on its host' if alive is None else ''}, "
                    f"delete {str(path)!r}") from None
            warnings.warn(f"{path}: took over the lock of a run that is no longer running "
                          f"({_holder_text(holder) if holder else 'unreadable lock file'})", stacklevel=3)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            continue
        except OSError as e:
            raise unwritable(e, run_dir) from e
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(me))
        break
    else:
        raise RunFolderError(f"run folder {str(run_dir)!r}: could not take its lock {str(path)!r} (it keeps being "
                             "taken by other processes). Fix: give this run another name (name=...)")
    try:
        yield path
    finally:
        if _read(path).get("pid") == me["pid"]:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


DISK_ERRNOS = {"ENOSPC": "the disk is full", "EDQUOT": "the disk quota is used up", "EROFS": "the file system is read-only",
               "EACCES": "permission denied", "EPERM": "permission denied"}


def unwritable(error: OSError, where: str | Path) -> RunFolderError:
    """``error`` (a write under ``where`` that failed) as one clear message naming the path and the fix."""
    name = errno.errorcode.get(error.errno or 0, "")
    reason = DISK_ERRNOS.get(name, f"{type(error).__name__}: {error.strerror or error}")
    path = error.filename or where
    if name in ("ENOSPC", "EDQUOT"):
        fix = ("free space there (or point logger.log_dir and checkpointing.checkpoint_dir at a disk with room), then "
               "continue with rlkit train ... --resume: the steps logged so far and the last checkpoint are kept")
    else:
        fix = (f"make {str(where)!r} writable, or set logger.log_dir (and checkpointing.checkpoint_dir) to a folder "
               "you can write")
    return RunFolderError(f"cannot write {str(path)!r}: {reason}. Fix: {fix}")


def is_disk_error(error: BaseException) -> bool:
    return isinstance(error, OSError) and errno.errorcode.get(error.errno or 0, "") in DISK_ERRNOS
