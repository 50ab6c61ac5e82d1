"""Calls run one way, as imports do: nothing below ``rlkit/session.py`` takes, names or reaches a Session.

The import contract (tests/test_layers.py) cannot see a session passed down as an argument and called back; this
walks every module below the session's layer and fails on a parameter, variable or attribute named ``session``
and on the name ``Session``: a stage, the run, a builder or a display gets the parts it works on (the run, the
policy, a callable), never the facade. The facade layers above (session, experiment, demo, sweep, cli) may."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

RLKIT = Path(__file__).resolve().parents[2] / "rlkit"


def layers_above_the_session() -> set[str]:
    """The modules and packages the import contract (setup.cfg's layers) puts above the session's layer: the
    facades that may hold a Session (cli, sweep, the Tinker service, demo, experiment)."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(RLKIT.parent / "setup.cfg")
    layers = [line.split("#")[0].strip() for line in cfg["importlinter:contract:layers"]["layers"].splitlines()]
    above = layers[:next(i for i, line in enumerate(layers) if "session" in line.replace(":", " ").split())]
    return {name.strip() for line in above for name in line.replace("|", ":").split(":") if name.strip()}


ABOVE_NAMES = layers_above_the_session()
ABOVE = {"__init__.py", "session.py", "__main__.py"} | {f"{name}.py" for name in ABOVE_NAMES}


def session_references(source: str) -> list[str]:
    """Each place ``source`` takes, names or reaches a session: ``line: what``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.arg) and node.arg == "session":
            found.append(f"{node.lineno}: parameter 'session'")
        elif isinstance(node, ast.Name) and node.id in ("session", "Session"):
            found.append(f"{node.lineno}: name {node.id!r}")
        elif isinstance(node, ast.Attribute) and node.attr in ("session", "Session"):
            found.append(f"{node.lineno}: attribute '.{node.attr}'")
        elif isinstance(node, ast.ImportFrom) and node.module == "rlkit.session":
            found.append(f"{node.lineno}: import from rlkit.session")
    return found


def modules_below_the_session() -> list[Path]:
    return sorted(p for p in RLKIT.rglob("*.py") if not (p.parent == RLKIT and p.name in ABOVE)
                  and p.relative_to(RLKIT).parts[0] not in ABOVE_NAMES)  # (a package above: the Tinker service)


def test_no_module_below_the_session_reaches_one():
    offenders = {str(p.relative_to(RLKIT)): refs for p in modules_below_the_session()
                 if (refs := session_references(p.read_text()))}
    assert offenders == {}


@pytest.mark.parametrize("source", [
    "def step(session):\n    return 1\n",
    "def step(run):\n    return run.session.policy\n",
    "def f(x: 'Any'):\n    session = x\n",
    "from rlkit.session import Session\n",
])
def test_the_walk_finds_a_session_passed_down(source):
    assert session_references(source)


def test_the_walk_covers_the_run_and_the_builders():
    names = {str(p.relative_to(RLKIT)) for p in modules_below_the_session()}
    assert {"run/run.py", "run/loop.py", "run/fork.py", "builders.py", "notebook/dashboard.py",
            "tracking/checkpoint.py"} <= names
    assert ABOVE_NAMES == {"cli", "sweep", "tinker_api", "demo", "experiment"}  # read from the import contract
    assert not any(n.startswith(("tinker_api/", "sweep.py", "cli.py")) for n in names)
