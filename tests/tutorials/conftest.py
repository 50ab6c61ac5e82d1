import os

import pytest

from tests.tutorials.notebooks import jupyter_path_env, write_kernelspec


@pytest.fixture(scope="session")
def venv_kernel(tmp_path_factory):
    """A kernel spec for this venv's Python in a temporary JUPYTER_PATH (set for the whole test session)."""
    path = tmp_path_factory.mktemp("jupyter")
    write_kernelspec(path)
    saved = os.environ.get("JUPYTER_PATH")
    os.environ.update(jupyter_path_env(path))
    yield path
    if saved is None:
        os.environ.pop("JUPYTER_PATH", None)
    else:
        os.environ["JUPYTER_PATH"] = saved
