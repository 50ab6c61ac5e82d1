"""The built docs site in a real browser: Debian's headless Chromium through Playwright (``scripts/test.sh browser``).

The site is built as ``make docs`` builds it and served from its folder by ``http.server`` on a free localhost
port (Material's search runs in a web worker, which ``file://`` does not allow). The test searches for "LoRA" and
takes screenshots of the home page, the search results and a rendered tutorial into ``test-output/docs/``.
"""

from __future__ import annotations

import functools
import http.server
import threading
from pathlib import Path

import pytest

from tests.docs.site import REPO, missing_docs_packages
from tests.tutorials.test_browser import CHROMIUM, CHROMIUM_ARGS

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900),
              pytest.mark.skipif(bool(missing_docs_packages()), reason="docs packages not installed: run "
                                 "scripts/setup-docs.sh (scripts/test.sh browser does)")]

OUTPUT = REPO / "test-output" / "docs"
TUTORIAL = "tutorials/10_your_model_with_adapters.html"


def expects_test_outputs(page_path: str) -> bool:
    """Whether the docs hook renders this tutorial with the tutorial tests' outputs (scripts/docs_hooks.py)."""
    import importlib.util

    import nbformat

    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "scripts" / "docs_hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    name = Path(page_path).with_suffix(".ipynb").name
    _, why = hooks.with_test_outputs(nbformat.read(str(hooks.TUTORIALS / name), as_version=4), hooks.EXECUTED / name)
    return not why


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # no line per request in the test's output
        pass


@pytest.fixture(scope="module")
def served_site(built_site):
    site, _, _ = built_site
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def page():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/setup-browser.sh (Debian's chromium package)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        failed = []
        page.on("requestfailed", lambda request: failed.append(request.url))
        page.failed_requests = failed
        yield page
        browser.close()


def test_home_page_search_and_a_rendered_tutorial(served_site, page):
    OUTPUT.mkdir(parents=True, exist_ok=True)
    page.goto(f"{served_site}/index.html", wait_until="networkidle")
    assert "rlkit" in page.title()
    assert page.locator("article h1").first.inner_text().startswith("rlkit")  # then the permalink sign
    assert page.locator("article table").count() >= 1  # the "where to go" table
    page.screenshot(path=str(OUTPUT / "home.png"))

    page.locator("label.md-search__icon, .md-search__input").first.click()
    page.locator("input.md-search__input").press_sequentially("LoRA", delay=50)  # typed: Material reads keyup
    results = page.locator(".md-search-result__item")
    results.first.wait_for(timeout=60_000)
    meta = page.locator(".md-search-result__meta").inner_text()
    titles = " ".join(results.all_inner_texts())
    print(f"search 'LoRA': {meta}; first results: {titles[:300]!r}")
    assert results.count() >= 2, meta
    assert "adapters" in titles.lower() or "lora" in titles.lower()
    page.screenshot(path=str(OUTPUT / "search_lora.png"))

    page.goto(f"{served_site}/{TUTORIAL}", wait_until="networkidle")
    content = page.locator("article")
    assert "Your model with adapters" in content.inner_text()
    assert page.locator(".jp-Cell, .jp-CodeCell, .highlight-ipynb").count() > 5  # cells rendered by mkdocs-jupyter
    outputs = page.locator(".jp-OutputArea-output").count()
    print(f"{TUTORIAL}: {outputs} rendered outputs")
    if expects_test_outputs(TUTORIAL):  # the tutorial tests ran on this checkout: the page shows their outputs
        assert outputs > 5
    page.screenshot(path=str(OUTPUT / "tutorial_10.png"))
    rich = page.locator(".jp-OutputArea-output table, .jp-OutputArea-output img")
    if rich.count():
        rich.first.scroll_into_view_if_needed()
        page.screenshot(path=str(OUTPUT / "tutorial_10_outputs.png"))
    assert not page.failed_requests, f"requests that failed (offline site): {page.failed_requests}"
