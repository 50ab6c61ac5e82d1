import pytest

from tests.docs.site import build_site


@pytest.fixture(scope="session")
def built_site(tmp_path_factory):
    """The docs site built once with ``--strict`` into a temporary folder: (folder, seconds, build log)."""
    folder = tmp_path_factory.mktemp("docs") / "site"
    result, seconds = build_site(folder)
    log = result.stdout + result.stderr
    assert result.returncode == 0, f"mkdocs build --strict failed after {seconds:.0f} s:\n{log[-6000:]}"
    return folder, seconds, log
