"""The docs site builds with ``--strict`` (no broken link, no missing reference), and holds what a newcomer looks for.

The same build as ``make docs``, into a temporary folder. ``scripts/test.sh`` sets the docs packages up
(``scripts/setup-docs.sh``), so the test runs in CI; it is skipped only where they are not installed.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.docs.site import missing_docs_packages

pytestmark = pytest.mark.skipif(bool(missing_docs_packages()),
                                reason=f"docs packages not installed ({', '.join(missing_docs_packages())}): "
                                       "run scripts/setup-docs.sh (scripts/test.sh does)")

# What a newcomer in JupyterLab had to find in the source (issue 34), each as the site's search holds it
NEWCOMER_TERMS = {
    "the reward function's signature": "f(prompts, completions, **columns)",
    "SFT on your own data": "sft.response_key",
    "the environment keyword of Session.load": "Session.load(path, env=...)",
    "HF export from a notebook": "session.export_hf",
    "wandb from a notebook": "wandb=True",
    "GSPO's clip values": "ratio_clip_min=3e-4",
}


def search_text(site) -> str:
    index = json.loads((site / "search" / "search_index.json").read_text())
    return " ".join(doc["title"] + " " + doc["text"] for doc in index["docs"])


def test_site_builds_strict_with_every_page(built_site):
    site, seconds, log = built_site
    print(f"mkdocs build --strict: {seconds:.1f} s")
    assert "WARNING" not in log
    for page in ["index.html", "tutorials/01_quickstart.html", "tutorials/10_your_model_with_adapters.html",
                 "reference/config.html", "reference/api/session.html", "howto/extending.html",
                 "howto/what-if.html", "howto/agents.html", "measurements.html", "architecture.html"]:
        assert (site / page).is_file(), f"{page} is missing from the built site"
    api = (site / "reference" / "api" / "session.html").read_text()
    assert "export_hf" in api and "Session" in api  # mkdocstrings rendered the class from its docstrings


def test_config_reference_lists_every_key_with_type_and_default(built_site):
    site, _, _ = built_site
    from rlkit.config.run import RunConfig

    html = (site / "reference" / "config.html").read_text()
    keys = []

    def walk(model, prefix):
        import dataclasses

        from pydantic import BaseModel

        names = list(type(model).model_fields) if isinstance(model, BaseModel) else [
            f.name for f in dataclasses.fields(model)]
        for name in names:
            value = getattr(model, name)
            if isinstance(value, BaseModel) or (dataclasses.is_dataclass(value) and not isinstance(value, type)):
                walk(value, f"{prefix}{name}.")
            else:
                keys.append(f"{prefix}{name}")

    walk(RunConfig(), "")
    assert len(keys) > 100
    missing = [k for k in keys if f"<code>{k}</code>" not in html]
    assert not missing, f"keys missing from the config reference: {missing}"
    row = re.search(r"<code>loss_fn\.kl_estimator</code>.*?</tr>", html, re.S).group(0)
    assert "reference_policy_kl_type" in row and "k3" in row  # NeMo-RL's name and the default
    # each key says what configure() does with it, as rlkit.config.changes decides
    from rlkit.config.changes import Change, change_for

    words = {Change.LIVE: "live", Change.ROLLOUTS: "new rollout source", Change.LOSS: "new loss",
             Change.OPTIMIZER: "new optimizer", Change.MODELS: "critic or teacher built",
             Change.RUN: "reset()", Change.SESSION: "new Session"}
    for key in keys:
        row = re.search(rf"<code>{re.escape(key)}</code>.*?</tr>", html, re.S).group(0)
        assert words[change_for(key)] in row, (key, change_for(key))
    assert "live" in re.search(r"<code>history\.full_weight_snapshots</code>.*?</tr>", html, re.S).group(0)
    assert "new Session" in re.search(r"<code>policy\.generation\.temperature</code>.*?</tr>", html, re.S).group(0)
    assert "critic or teacher" in re.search(r"<code>distillation\.enabled</code>.*?</tr>", html, re.S).group(0)


def test_search_finds_what_the_newcomer_looked_for(built_site):
    site, _, _ = built_site
    text = search_text(site).replace("&quot;", '"').replace("&gt;", ">").replace("&lt;", "<")
    missing = {what: term for what, term in NEWCOMER_TERMS.items() if term not in text}
    assert not missing, f"not in the search index: {missing}"


def test_site_needs_no_network(built_site):
    """No script, stylesheet or font from another host: the site works offline."""
    site, _, _ = built_site
    remote = re.compile(r"""<(?:script|link|img)\b[^>]*(?:src|href)=["']https?://""", re.I)
    offenders = [str(p.relative_to(site)) for p in site.rglob("*.html") if remote.search(p.read_text())]
    assert not offenders, f"pages that load from the network: {offenders[:5]}"
