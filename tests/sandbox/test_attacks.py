"""Issue 31's attack catalogue against the Python tool's sandbox (rlkit/sandbox/attacks.py): every attack
a policy's program could make on the trainer, its files, its secrets or the next calls is held.

Each attack runs through ``run_python`` in a victim process standing in for the trainer (in a PID namespace of
its own, so an escaped ``kill(-1)`` ends only the victim), and the host is checked afterwards: the bait folder,
``/dev/shm``, a TCP and a Unix listener, the victim's surviving descendants. Against the sandbox of main before
issue 31 (2d0a13b), 28 of these 29 attacks were not held; the one held there was TCP to 127.0.0.1 where user
namespaces exist (its variant without them was not). See docs/measurements.md.
Skipped, with the reason, only where the kernel gives no user namespaces (CI's machine has them).
"""

import pytest

from rlkit.sandbox import SandboxUnavailableError, resolve_backend
from rlkit.sandbox.attacks import ATTACKS
from rlkit.sandbox.check import format_table, run_attacks


def _why_no_sandbox() -> str:
    try:
        resolve_backend("auto")
        return ""
    except SandboxUnavailableError as exc:
        return str(exc)


pytestmark = pytest.mark.skipif(bool(_why_no_sandbox()), reason=f"no kernel sandbox here: {_why_no_sandbox()}")


@pytest.fixture(scope="module")
def table() -> dict:
    rows = run_attacks()
    print(format_table(rows))
    return {row["name"]: row for row in rows}


@pytest.mark.parametrize("name", [attack.name for attack in ATTACKS])
def test_the_attack_is_held(table, name):
    row = table[name]
    assert row["held"] is True, f"{name}: {row['detail']}"


def test_the_catalogue_has_every_case_of_the_issue():
    names = " | ".join(attack.name for attack in ATTACKS)
    for case in ("SIGKILL", "SIGSTOP", "SIGINT", "kill(-1)", "dir_fd", "hard link", "os.replace", "truncate", "chmod",
                 "symlink outside", "/dev/shm", "audit guard", "environ", "dataset", "project", "normal exit", "setsid",
                 "double fork", "relay", "memory of several children", "300 processes", "_posixsubprocess",
                 "TCP to 127.0.0.1", "Unix socket", "deleted", "FIFO", "replaced by a symlink"):
        assert case in names, case


def test_the_check_reports_an_attack_that_is_not_held():
    # the same harness against plain processes (PythonTool(sandbox="unsafe-process")): the trainer dies, the answers leak
    picked = [a for a in ATTACKS if a.name in ("kill the parent (SIGKILL)", "read the dataset's answers")]
    rows = run_attacks(sandbox="unsafe-process", attacks=picked)  # (the victim process gets the warning)
    assert [(row["name"], row["held"]) for row in rows] == [(a.name, False) for a in picked], rows
