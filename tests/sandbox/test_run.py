"""The Python sandbox (:mod:`rlkit.sandbox.run`): it runs code and contains its failures, writes only in its temp
dir, has no network, sees only its own processes and files, and says which kernel backend it uses."""

import time
from pathlib import Path

from rlkit.sandbox import SandboxLimits, describe_backend, resolve_backend, run_python


def test_the_python_sandbox_runs_code_and_contains_its_failures():
    assert run_python("print(sum(range(10)))").output == "45\n"
    limits = SandboxLimits(wall_seconds=1.5, cpu_seconds=1)
    cases = {
        "import time; time.sleep(30)": ("timeout",),
        "while True: pass": ("killed by SIGXCPU", "timeout"),  # whichever limit comes first on a loaded machine
        "raise ValueError('boom')": ("exit 1",),
        "x = bytearray(2**31)": ("exit 1",),  # RLIMIT_AS: MemoryError
    }
    for code, reason in cases.items():
        t0 = time.perf_counter()
        result = run_python(code, limits)
        assert result.reason.startswith(reason), (code, result)
        assert not result.ok
        # the wall limit counts from the program's start; the interpreter's start-up is allowed apart
        assert time.perf_counter() - t0 - result.startup_seconds < limits.wall_seconds + 1.0, (code, result)
    no_start = run_python("print(1)", SandboxLimits(startup_seconds=1e-4))  # no interpreter starts in 0.1 ms
    assert no_start.reason == "timeout (the interpreter did not start in 0.0001 s)" and not no_start.ok
    flood = run_python("print('x' * 10**7)", limits)  # output capped by RLIMIT_FSIZE, returned head only
    assert not flood.ok and len(flood.output) <= limits.max_output_chars + len("... [truncated]")


def test_the_python_sandbox_writes_only_in_its_temp_dir_and_has_no_network(tmp_path):
    outside = tmp_path / "escaped.txt"
    result = run_python(f"open({str(outside)!r}, 'w').write('x')")
    assert not result.ok and "PermissionError" in result.output and not outside.exists()
    assert run_python("open('inside.txt', 'w').write('ok'); print(open('inside.txt').read())").output == "ok\n"
    assert not run_python("import os; os.system('touch /tmp/x')").ok
    net = run_python("import socket; socket.create_connection(('127.0.0.1', 22), timeout=1)")
    assert not net.ok
    ifaces = run_python("print([line.split(':')[0].strip() for line in open('/proc/net/dev').readlines()[2:]])")
    assert ifaces.output == "['lo']\n"  # the kernel guard: a network namespace with no interface but loopback


def test_the_python_sandbox_sees_only_its_own_processes_and_files():
    project = Path(__file__).resolve().parents[2]
    seen = run_python("import os; print(sorted(os.listdir('/')))\n"
                      "print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()) == [1, os.getpid()])\n"
                      f"print(os.path.exists({str(project)!r}), os.path.exists({str(Path.home())!r} + '/.bashrc'))")
    assert seen.ok, seen
    top = set(seen.output.splitlines()[0].strip("[]").replace("'", "").split(", "))
    assert {"usr", "tmp", "proc", "dev"} <= top and not top & {"work", "home", "run", "mnt", "opt", "var"}, top
    assert seen.output.splitlines()[2] == "False False"  # the project and the home directory are not there
    assert seen.output.splitlines()[1] == "True"  # the namespace's init and the program: nothing of the host
    readonly = run_python("open('/usr/rlkit-x', 'wb')")  # the audit hook names it; the kernel refuses it anyway
    assert not readonly.ok and "PermissionError" in readonly.output
    kernel = run_python("import os; os.open('rlkit-x', os.O_CREAT | os.O_WRONLY, dir_fd=os.open('/usr', 0))")
    assert not kernel.ok and "Read-only file system" in kernel.output


def test_the_sandbox_picks_a_kernel_backend_and_says_which():
    assert resolve_backend("auto") in ("bwrap", "unshare")
    assert describe_backend().startswith(("bwrap", "unshare"))
