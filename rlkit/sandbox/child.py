"""The child side of :mod:`rlkit.sandbox.run`: what runs inside the namespaces, as their PID 1.

This file is not imported by the package at run time: :func:`rlkit.sandbox.run.run_python` has
``python -I -S`` (standard library only, no ``site``) import it as a top-level module (its bytecode cached in
``__pycache__``) and call :func:`main`, with one argument: its config as a Python literal
(``repr`` of a dict of strings, numbers and tuples; read with ``eval`` and no builtins, since importing ``json``
or ``ast`` would double the interpreter's start-up). Its ``main``:

1. ``unshare`` backend: builds the file system of the call in its new mount namespace (a tmpfs root holding
   read-only binds of only what the interpreter needs, a fresh ``/proc`` of the new PID namespace, a small
   tmpfs ``/tmp`` with the working directory ``/tmp/rlkit-sandbox``) and ``pivot_root``s into it, detaching the host's tree (``bwrap`` does all this itself);
2. where the call has cgroups, waits for the parent's word that it has moved this process into them (the
   parent does it while this interpreter starts: a cgroup v1 move waits for an RCU grace period, ~10 ms);
3. forks the program's process and stays behind as a small init: it tells the parent the program started
   (one byte on the status pipe), waits for it, writes its wait status, and exits. Being PID 1, its exit makes
   the kernel kill every process left in the namespace;
4. in the program's process: resource limits, every capability dropped (bounding set too, no new privileges;
   the mounts stay read-only whatever the program does), the audit hook (the second guard: clear messages for
   an honest program's mistakes), then ``exec`` of the program's text.
"""

import os
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
_STATVFS_LOCKED = {2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: 1024, 2048: 2048}  # flags a remount must keep
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217}

def _make_guard(root: str):
    """The second guard, for honest mistakes only (the boundary is the kernel's): refuse writes outside the
    working directory, starting processes and sockets, with a message that says so."""

    def inside(path) -> bool:
        try:
            return os.path.realpath(os.fsdecode(path)).startswith(root + os.sep)
        except Exception:  # noqa: BLE001
            return False

    def guard(event, args):
        if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            mode, flags = (args[1] or "r"), (args[2] or 0)
            writes = any(c in str(mode) for c in "wax+") or flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
            if writes and not inside(args[0]):
                raise PermissionError(f"sandbox: writing outside the temp dir is not allowed: {args[0]}")
        elif event in ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "shutil.rmtree") and args:
            if not inside(args[0]):
                raise PermissionError(f"sandbox: {event} outside the temp dir is not allowed: {args[0]}")
        elif event.startswith("socket.") or event in ("os.system", "subprocess.Popen", "os.exec", "os.posix_spawn"):
            raise PermissionError(f"sandbox: {event} is not allowed")

    return guard


def _libc(name: str):
    """A C function of the process by name, called with ints, bytes (``char *``) and None (NULL); ``_ctypes``
    itself, since importing ``ctypes`` costs more than all the set-up's system calls together."""
    import _ctypes

    address = _ctypes.dlsym(_ctypes.dlopen(None, 2), name)
    return lambda *args: _ctypes.call_function(address, args)


def _check(result: int, what: str) -> None:
    if result != 0:
        raise OSError(f"sandbox set-up: {what} failed (the kernel refused it)")


def build_root(config: dict) -> None:
    """The call's file system (``unshare`` backend): see the module docstring, step 2."""
    libc_mount = _libc("mount")

    def mount(source, target, fstype, flags, data=None):
        enc = lambda s: None if s is None else os.fsencode(s)  # noqa: E731
        _check(libc_mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")

    mount(None, "/", None, MS_REC | MS_PRIVATE)
    new = config["mountpoint"]
    mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    for link, target in config["symlinks"]:
        os.symlink(target, new + link)
    for source, target in config["binds"]:
        path = new + target
        if os.path.isdir(source):
            os.makedirs(path, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "w").close()
        mount(source, path, None, MS_BIND | MS_REC)
        kept = sum(v for k, v in _STATVFS_LOCKED.items() if os.statvfs(source).f_flag & k)
        device = target.startswith("/dev/")
        mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | (0 if device else MS_NODEV) | kept)
    os.makedirs(new + "/proc")
    mount("proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)  # before the host's /proc is gone
    os.makedirs(new + "/tmp")
    mount("tmpfs", new + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={config['tmp_kb']}k,mode=1777")
    os.mkdir(new + config["workdir"])
    os.chdir(new)
    number = _PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(f"sandbox set-up: pivot_root's number on {os.uname().machine} is not known")
    _check(_libc("syscall")(number, b".", b"."), "pivot_root")  # the old root is stacked under the new
    _check(_libc("umount2")(b".", 2), "detach the host's root")  # MNT_DETACH
    os.chdir("/")
    mount(None, "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def drop_privileges() -> None:
    """Every capability gone for good: bounding and ambient sets, the root special case, then capset(0)."""
    prctl = _libc("prctl")
    prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL
    for cap in range(64):
        prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP (EINVAL past the last capability; EPERM if gone already)
    prctl(28, 0x2F, 0, 0, 0)  # PR_SET_SECUREBITS: NOROOT, NO_SETUID_FIXUP, KEEP_CAPS off, all locked
    header = (0x20080522).to_bytes(4, sys.byteorder) + bytes(4)  # _LINUX_CAPABILITY_VERSION_3, this thread
    _check(_libc("capset")(header, bytes(24)), "capset")  # effective, permitted, inheritable: all empty


def run_program(config: dict, code: bytes) -> None:
    """The program's process: limits, privileges dropped, the audit hook, the program."""
    import _signal
    import resource

    _signal.signal(_signal.SIGINT, _signal.default_int_handler)  # KeyboardInterrupt, as in any program
    if config["new_session"]:
        os.setsid()
    for name, value in config["rlimits"]:
        resource.setrlimit(getattr(resource, name), tuple(value))
    drop_privileges()
    os.chdir(config["workdir"])
    sys.addaudithook(_make_guard(os.path.realpath(os.getcwd())))
    try:
        exec(compile(code, "<tool>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - the program's own frames only: the traceback is the output
        import traceback

        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<tool>"]
        sys.stdout.flush()
        sys.stderr.write("Traceback (most recent call last):\n" + "".join(traceback.format_list(frames))
                         + "".join(traceback.format_exception_only(type(exc), exc)))
        raise SystemExit(1) from None


def main() -> None:
    import _signal

    _signal.signal(_signal.SIGINT, _signal.SIG_DFL)  # no handler: the namespace's init then ignores it
    config = eval(sys.argv[1], {"__builtins__": {}})  # noqa: S307 - the parent's repr of plain data
    status = config["status_fd"]
    with open(config["program"], "rb") as f:
        code = f.read()
    if config["build_root"]:
        build_root(config)
    if config["go_fd"] is not None:  # the parent has moved this process into the call's cgroups: "1"
        if os.read(config["go_fd"], 1) != b"1":
            os.write(2, b"sandbox set-up: the call's cgroups could not be joined\n")
            os._exit(70)
        os.close(config["go_fd"])
    pid = os.fork()
    if pid == 0:
        os.close(status)
        run_program(config, code)
        return
    os.close(0), os.close(1), os.close(2)  # only the program and what it starts hold the output pipe
    os.write(status, b".")  # the program starts now: the parent's wall clock begins
    _, wait_status = os.waitpid(pid, 0)
    os.write(status, b"%d\n" % wait_status)
    os._exit(0)


if __name__ == "__main__":
    main()
