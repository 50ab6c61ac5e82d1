"""What a fresh ``make docs`` shows of the tutorials, said where the reader meets it: the build never executes a
notebook, so without a tutorial test run a tutorial page has no outputs and says how to get them
(``make docs-with-outputs``, which runs the tutorial tests and then the build); the README says the same."""

import importlib.util
import re

import nbformat

from tests.tutorials.notebooks import REPO


def hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "scripts" / "docs_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_tutorial_without_a_test_run_says_it_has_no_outputs_and_how_to_get_them(tmp_path):
    h = hooks()
    first = sorted(h.TUTORIALS.glob("[0-9][0-9]_*.ipynb"))[0]
    _, why = h.with_test_outputs(nbformat.read(str(first), as_version=4), tmp_path / first.name)  # no executed copy
    note = h.without_outputs_note(why)
    assert "without its outputs (no executed copy from a tutorial test run)" in note
    assert "`make docs-with-outputs`" in note


def test_make_docs_with_outputs_runs_the_tutorial_tests_then_builds():
    makefile = (REPO / "Makefile").read_text()
    recipe = re.search(r"^docs-with-outputs:.*\n((?:\t.*\n)+)", makefile, re.M).group(1)
    assert "tests/tutorials/test_tutorials.py" in recipe and recipe.rstrip().endswith("$(MAKE) docs")


def test_the_readme_says_what_a_fresh_build_shows():
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "the docs site shows them with their outputs." not in readme
    assert "a fresh `make docs` shows them without outputs" in readme and "`make docs-with-outputs`" in readme
