"""``rlkit sandbox-check``: run the attack catalogue (:mod:`rlkit.sandbox.attacks`) against the Python tool's
sandbox and print which attacks are held.

Each attack is run by a victim process standing in for the trainer: it calls ``run_python`` on the attack's
code, reports what came back, which of its descendants are still alive after the call and the CPU they used
in the second after it. The victim runs inside a PID namespace of its own where one can be made, so that an
attack that escapes (``kill(-1)``) ends only the victim; a victim that dies or hangs during an attack counts
that attack as not held, and a new victim runs the rest. This module's other side checks the host: the bait
folder, ``/dev/shm``, the TCP and Unix listeners.

``module`` may name another implementation of ``run_python`` (a dotted module or a ``.py`` file) to check it
the same way, e.g. an older version of the sandbox.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

from rlkit.sandbox.attacks import ATTACKS, Attack

_ROOT = Path(__file__).resolve().parents[2]
_VICTIM_TIMEOUT_S = 25.0  # per attack: the sandbox's own bound (startup + wall) is far below
_VICTIM = r'''
import ctypes, importlib, importlib.util, json, os, signal, sys, time, types
spec = json.loads(sys.argv[1])
signal.signal(signal.SIGINT, signal.default_int_handler)  # as a trainer has it (a background shell ignores it)
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans of the call come back to this process
if spec["module"].endswith(".py"):
    loader = importlib.util.spec_from_file_location("checked_sandbox", spec["module"])
    sandbox = importlib.util.module_from_spec(loader); sys.modules["checked_sandbox"] = sandbox
    loader.loader.exec_module(sandbox)
else:  # the rlkit package without its __init__ (which imports torch)
    for name in ("rlkit", "rlkit.sandbox"):
        package = types.ModuleType(name); package.__path__ = [os.path.join(spec["root"], *name.split("."))]
        sys.modules[name] = package
    sandbox = importlib.import_module(spec["module"])

def descendants():
    found, todo = [], [os.getpid()]
    while todo:
        pid = todo.pop()
        for task in os.listdir(f"/proc/{pid}/task") if os.path.exists(f"/proc/{pid}/task") else []:
            try:
                children = [int(c) for c in open(f"/proc/{pid}/task/{task}/children").read().split()]
            except OSError:
                continue
            found += children; todo += children
    alive = []
    for pid in found:
        try:
            if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
                alive.append(pid)
        except OSError:
            pass
    return alive

def reap():
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return

limits = sandbox.SandboxLimits(wall_seconds=10.0, cpu_seconds=2, memory_mb=spec["memory_mb"])
for name, code in spec["attacks"]:
    code = code.replace("{victim}", str(os.getpid()))
    print(json.dumps({"start": name}), flush=True)
    record = {"name": name, "returned": False}
    t0 = time.perf_counter()
    try:
        kwargs = {"sandbox": spec["sandbox"]} if spec["sandbox"] else {}
        result = sandbox.run_python(code, limits, **kwargs)
        record.update(returned=True, output=result.output, reason=result.reason)
    except BaseException as exc:
        record.update(returned=True, raised=f"{type(exc).__name__}: {exc}")
    record["seconds"] = time.perf_counter() - t0
    time.sleep(0.2); reap()
    record["leftovers"] = len(descendants())
    cpu0 = os.times(); cpu0 = cpu0.children_user + cpu0.children_system
    for _ in range(6):
        time.sleep(0.1); reap()
    record["leftovers_later"] = len(descendants())
    for pid in descendants():
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.05); reap()
    cpu1 = os.times(); record["cpu_after"] = cpu1.children_user + cpu1.children_system - cpu0
    print(json.dumps(record), flush=True)
'''
_INIT = "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]) & 255)"  # PID 1, so the victim can be killed


def _pid_namespace_wrapper() -> list[str]:
    """The prefix that runs the victim in its own PID namespace (empty where none can be made)."""
    unshare = shutil.which("unshare")  # absolute: a victim's PATH may be empty on purpose
    for prefix in ([unshare, "--pid", "--fork", "--mount-proc"], [unshare, "-r", "--pid", "--fork", "--mount-proc"]):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            if unshare and subprocess.run(prefix + ["true"], capture_output=True, timeout=10).returncode == 0:
                return prefix + [sys.executable, "-c", _INIT]
    return []


class _Host:
    """The host side of a check: bait folder, dataset, listeners; what the attacks changed."""

    def __init__(self) -> None:
        self.token = os.urandom(8).hex()
        self.bait = tempfile.mkdtemp(prefix="rlkit-bait-")
        Path(self.bait, "bait.txt").write_text("original")
        os.chmod(Path(self.bait, "bait.txt"), 0o644)
        self.dataset = os.path.join(self.bait, "dataset.jsonl")
        Path(self.dataset).write_text(json.dumps({"prompt": "1+1", "answer": f"answer-{self.token}"}) + "\n")
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(os.path.join(self.bait, "sock"))
        self.unix.listen()
        for listener in (self.tcp, self.unix):
            listener.setblocking(False)
        self.project_file = str(_ROOT / "rlkit" / "sandbox" / "run.py")
        self.project_marker = Path(self.project_file).read_text()[:60]
        self.listing = self._listing()

    def _listing(self) -> dict:
        return {p.name: (p.lstat().st_mode, p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
                for p in Path(self.bait).iterdir()}

    def fill(self, code: str) -> str:
        for key, value in (("{bait!r}", repr(self.bait)), ("{bait}", self.bait), ("{port}", str(self.tcp.getsockname()[1])),
                           ("{token}", self.token), ("{project_file!r}", repr(self.project_file))):
            code = code.replace(key, value)
        return code

    def observe(self, memory_mb: int) -> dict:
        """What the last attack changed on the host (and put it back)."""
        seen = {"token": self.token, "project_marker": self.project_marker, "memory_mb": memory_mb,
                "bait_intact": self._listing() == self.listing}
        shm = Path(f"/dev/shm/rlkit-attack-{self.token}")
        seen["shm_written"] = shm.exists()
        for name, listener in (("tcp_connected", self.tcp), ("unix_connected", self.unix)):
            try:
                listener.accept()[0].close()
                seen[name] = True
            except BlockingIOError:
                seen[name] = False
        shm.unlink(missing_ok=True)
        for p in Path(self.bait).iterdir():
            if p.name not in self.listing:
                p.unlink()
        Path(self.bait, "bait.txt").write_text("original")
        os.chmod(Path(self.bait, "bait.txt"), 0o644)
        return seen

    def close(self) -> None:
        self.tcp.close(), self.unix.close()
        shutil.rmtree(self.bait, ignore_errors=True)


def run_attacks(module: str = "rlkit.sandbox.run", sandbox: Optional[str] = "auto", memory_mb: int = 192,
                attacks: Sequence[Attack] = ATTACKS) -> list[dict]:
    """Run ``attacks`` against ``module``'s ``run_python``; one dict per attack: name, group, held, detail."""
    host, wrapper = _Host(), _pid_namespace_wrapper()
    rows = []
    try:
        for victim in ("sandbox", "no-userns"):
            todo = [a for a in attacks if a.victim == victim]
            if victim == "no-userns":  # neither unshare nor bwrap on its PATH: a machine without user namespaces
                empty = env_path = tempfile.mkdtemp(prefix="rlkit-nopath-")
            else:
                empty, env_path = None, os.environ.get("PATH", "/usr/bin:/bin")
            while todo:
                todo = _run_victim(todo, host, wrapper, module, sandbox, memory_mb, env_path, rows)
            if empty:
                shutil.rmtree(empty, ignore_errors=True)
    finally:
        host.close()
    order = [a.name for a in attacks]
    return sorted(rows, key=lambda row: order.index(row["name"]))


def _run_victim(todo: list[Attack], host: _Host, wrapper: list[str], module: str, sandbox: Optional[str],
                memory_mb: int, path: str, rows: list[dict]) -> list[Attack]:
    """One victim runs ``todo`` in order until it dies or hangs; returns the attacks it did not get to."""
    runnable = [a for a in todo if wrapper or "kill(-1)" not in a.name]
    for attack in todo:
        if attack not in runnable:
            rows.append({"name": attack.name, "group": attack.group, "held": None,
                         "detail": "not run: no PID namespace to contain it here"})
    if not runnable:
        return []
    spec = {"module": module, "sandbox": sandbox, "root": str(_ROOT), "memory_mb": memory_mb,
            "attacks": [(a.name, host.fill(a.code)) for a in runnable]}
    env = {"RLKIT_ATTACK_SECRET": host.token, "PATH": path, "HOME": os.environ.get("HOME", "/root")}
    argv = wrapper + [sys.executable, "-c", _VICTIM, json.dumps(spec), host.dataset]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                            start_new_session=True)
    by_name = {a.name: a for a in runnable}
    current, lines = None, _lines(proc)
    try:
        while True:
            line = next(lines, None)
            if line is None or line == "":
                break
            record = json.loads(line) if line.startswith("{") else {}
            if "start" in record:
                current = by_name[record["start"]]
            elif "returned" in record and current is not None:
                held = current.held(record, host.observe(memory_mb))
                rows.append({"name": current.name, "group": current.group, "held": held, "detail": _detail(record)})
                current = None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        proc.wait()
        proc.stdout.close()
    done = {row["name"] for row in rows}
    if current is not None:
        host.observe(memory_mb)
        why = "the victim hung (stopped or blocked)" if line is None else f"the victim died (exit {proc.returncode})"
        rows.append({"name": current.name, "group": current.group, "held": False, "detail": why})
        done.add(current.name)
    return [a for a in runnable if a.name not in done]


def _lines(proc: subprocess.Popen):
    """The victim's stdout lines; None when a line takes longer than the per-attack bound (a hang)."""
    while True:
        if not select.select([proc.stdout], [], [], _VICTIM_TIMEOUT_S)[0]:
            yield None
            return
        line = proc.stdout.readline()
        yield line
        if not line:
            return


def _detail(record: dict) -> str:
    if record.get("raised"):
        return f"run_python raised {record['raised']}"[:90]
    extra = f"; {record['leftovers']}/{record['leftovers_later']} processes left" if record.get("leftovers") or record.get("leftovers_later") else ""
    last = (record.get("output", "").strip().splitlines() or [""])[-1]
    return f"{record.get('reason', '')}: {last[-60:]!r}{extra}"[:110]


def format_table(rows: list[dict]) -> str:
    mark = {True: "held", False: "NOT HELD", None: "not run"}
    width = max(len(r["name"]) for r in rows)
    lines = [f"{'attack':<{width}}  {'result':<8}  detail", "-" * (width + 40)]
    lines += [f"{r['name']:<{width}}  {mark[r['held']]:<8}  {r['detail']}" for r in rows]
    held = sum(r["held"] is True for r in rows)
    lines.append(f"{held} of {len(rows)} held")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``rlkit sandbox-check [--sandbox MODE] [--module M]``: exit 0 when every attack run is held."""
    parser = argparse.ArgumentParser(prog="rlkit sandbox-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sandbox", default="auto", choices=("auto", "bwrap", "unshare", "unsafe-process"))
    parser.add_argument("--module", default="rlkit.sandbox.run", help="the run_python to check (module or .py)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    if args.module == "rlkit.sandbox.run":
        from rlkit.sandbox.run import describe_backend

        print(f"backend: {describe_backend(args.sandbox)}")
    rows = run_attacks(args.module, None if args.module.endswith(".py") else args.sandbox)
    print(json.dumps(rows, indent=1) if args.json else format_table(rows))
    return 0 if all(r["held"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
