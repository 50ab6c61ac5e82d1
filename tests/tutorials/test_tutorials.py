"""Every tutorial runs top to bottom in a real Jupyter kernel on the CPU and asserts on its own results.

The assertions live in each tutorial's last cells (reward improved, mismatch small, an error caught ...),
so a tutorial that stops teaching the truth fails here. Outputs must be stripped in the repository.
The executed copy of each tutorial that passes is kept in ``test-output/tutorials/``: the docs site renders
the tutorials with those outputs (``scripts/docs_hooks.py``).
"""

import shutil

import nbformat
import pytest

from tests.tutorials.notebooks import REPO, TUTORIALS, execute, outputs_stripped

EXECUTED = REPO / "test-output" / "tutorials"  # read by scripts/docs_hooks.py

TUTORIAL_FILES = sorted(p.name for p in TUTORIALS.glob("[0-9][0-9]_*.ipynb"))


def test_the_seventeen_tutorials_exist_with_outputs_stripped():
    assert [name[:2] for name in TUTORIAL_FILES] == ["01", "02", "03", "04", "05", "06", "07", "08", "09", "10", "11",
                                                     "12", "13", "14", "15", "16", "17"]
    for name in TUTORIAL_FILES:
        nb = nbformat.read(str(TUTORIALS / name), as_version=4)
        nbformat.validate(nb)
        assert outputs_stripped(nb), (f"{name}: strip the outputs before committing "
                                      "(e.g. jupyter nbconvert --clear-output)")
        last_code = [c.source for c in nb.cells if c.cell_type == "code"][-3:]
        assert any("assert " in src for src in last_code), f"{name}: its last cells must assert on its results"


def test_one_fast_recipe_every_tutorial_on_the_quickstart_task_starts_from_quickstart_nano():
    """The fast recipe is the preset (README, docs/howto/notebooks.md), not a dict of overrides each tutorial keeps:
    no session or sweep of the quickstart preset in a tutorial, no TINY copy of its keys."""
    import re

    for name in TUTORIAL_FILES:
        code = "\n".join(c.source for c in nbformat.read(str(TUTORIALS / name), as_version=4).cells
                         if c.cell_type == "code")
        assert not re.search(r"(from_config|run_sweep)\(\s*\"quickstart\"", code), name
        assert "TINY" not in code, name


@pytest.mark.parametrize("name", TUTORIAL_FILES)
def test_tutorial_runs_and_its_checks_pass(name, venv_kernel, tmp_path):
    nb, seconds, skipped = execute(TUTORIALS / name, tmp_path)
    print(f"{name}: {seconds:.1f}s, skipped gpu cells {skipped}")
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    EXECUTED.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tmp_path / name, EXECUTED / f".{name}.tmp")
    (EXECUTED / f".{name}.tmp").replace(EXECUTED / name)  # whole or not at all for a build reading it


TEMPLATES = sorted((TUTORIALS.parent / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_templates_are_valid_stripped_and_compile(path):
    """The templates run full-size experiments, so they are not executed here; every cell must compile."""
    import ast

    nb = nbformat.read(str(path), as_version=4)
    nbformat.validate(nb)
    assert outputs_stripped(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            ast.parse(cell.source)
    assert {"session_template.ipynb", "ablation_template.ipynb"} <= {p.name for p in TEMPLATES}
