"""MkDocs hooks of rlkit's site (``mkdocs.yml``'s ``hooks:``): the pages that are generated at every build.

- ``tutorials/NN_*.ipynb``: each tutorial of ``tutorials/``, with the outputs of the tutorial tests' last run
  where there is one. ``tests/tutorials/test_tutorials.py`` keeps the executed copy of each tutorial that passed
  in ``test-output/tutorials/``; it is used when its cells are the committed notebook's (the ``gpu``-tagged ones
  the test runner blanks get their source back, without outputs) and it shows no error. Otherwise the committed
  notebook (outputs stripped) is rendered as it is, with a note saying so. mkdocs-jupyter renders them with
  ``execute: false``: the build never runs a notebook.
- ``reference/config.md``: every key of the run config (``rlkit.config.run.RunConfig``) with its type, its
  default in a run, its bounds, the NeMo-RL name the schema records, and the comment the source gives it.
  Read from the pydantic models and dataclasses themselves, so it cannot drift from them.

The generated files live in ``build/docs-gen/`` (ignored by git), outside ``docs/``; nothing is written into the
docs folder. The hook runs in the build's Python, ``.venv``'s, which imports ``rlkit.config``.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import logging
import os
import re
import textwrap
import tokenize
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parents[1]
TUTORIALS = REPO / "tutorials"
EXECUTED = REPO / "test-output" / "tutorials"
GENERATED = REPO / "build" / "docs-gen"
SKIPPED_PREFIX = "# skipped by the test runner"
log = logging.getLogger("mkdocs.hooks.rlkit")


def on_config(config):
    """The nav's "Tutorials" section: every ``tutorials/NN_*.ipynb``, in order (a new tutorial needs no edit here)."""
    for entry in config.nav or []:
        if isinstance(entry, dict) and "Tutorials" in entry:
            entry["Tutorials"] = [f"tutorials/{p.name}" for p in sorted(TUTORIALS.glob("[0-9][0-9]_*.ipynb"))]
    return config


@event_priority(100)  # before mkdocs-jupyter's on_files turns the notebooks into pages
def on_files(files, config):
    for name in tutorial_files():  # real files under build/docs-gen: mkdocs-jupyter reads them from src_dir
        files.append(File(f"tutorials/{name}", str(GENERATED), config.site_dir, config.use_directory_urls))
    files.append(File.generated(config, "reference/config.md", content=config_reference()))
    return files


def on_page_content(html, page, config, files):
    """reST roles in docstrings (``:mod:`x```, ``:class:`x```), which mkdocstrings leaves as text, shown as code."""
    return ROLE.sub(r"\1", html)


ROLE = re.compile(r":(?:class|mod|func|meth|attr|data|obj|exc):(<code>)")


# --- tutorials ---------------------------------------------------------------------------------------------


def tutorial_files() -> dict[str, Path]:
    """Write each tutorial as the site shows it into ``build/docs-gen/tutorials``; name -> path."""
    import nbformat

    out = GENERATED / "tutorials"
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for path in sorted(TUTORIALS.glob("[0-9][0-9]_*.ipynb")):
        committed = nbformat.read(str(path), as_version=4)
        nb, why = with_test_outputs(committed, EXECUTED / path.name)
        if why:
            log.info("tutorial %s: rendered without outputs (%s); `make docs-with-outputs` executes it", path.name, why)
            nb.cells.insert(1, nbformat.v4.new_markdown_cell(without_outputs_note(why)))
        target = out / path.name
        text = nbformat.writes(nb)
        if not target.exists() or target.read_text() != text:  # whole or not at all for a build running beside
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            tmp.write_text(text)
            tmp.replace(target)
        written[path.name] = target
    for stale in set(p.name for p in out.glob("*.ipynb")) - set(written):
        (out / stale).unlink()
    return written


def without_outputs_note(why: str) -> str:
    """What a tutorial's page says when it has no outputs (``why``), and how to get them."""
    return (f"*This page shows the committed notebook without its outputs ({why}). `make docs-with-outputs` "
            "executes the tutorials (their tests) and renders them with their outputs; `make test` followed by "
            "`make docs` does too.*")


def with_test_outputs(committed, executed_path: Path):
    """The committed notebook with the executed copy's outputs, or (committed, the reason it has none)."""
    import copy

    import nbformat

    if not executed_path.exists():
        return committed, "no executed copy from a tutorial test run"
    executed = nbformat.read(str(executed_path), as_version=4)
    if len(executed.cells) != len(committed.cells):
        return committed, "the executed copy is of another version of the notebook"
    nb = copy.deepcopy(committed)
    for mine, theirs in zip(nb.cells, executed.cells):
        if mine.cell_type != theirs.cell_type:
            return committed, "the executed copy is of another version of the notebook"
        if mine.cell_type != "code":
            continue
        if theirs.source.startswith(SKIPPED_PREFIX):  # a gpu cell: its source back, no outputs
            continue
        if theirs.source != mine.source:
            return committed, "the executed copy is of another version of the notebook"
        if any(o.get("output_type") == "error" for o in theirs.get("outputs", [])):
            return committed, "the executed copy shows an error"
        mine.outputs = theirs.get("outputs", [])
        mine.execution_count = theirs.get("execution_count")
    return nb, ""


# --- config reference --------------------------------------------------------------------------------------


def config_reference() -> str:
    from rlkit.config.run import RunConfig

    lines = [
        "# Config reference",
        "",
        "Every key of a run's config, generated at each docs build from `rlkit.config.run.RunConfig` and the "
        "sections it composes (`scripts/docs_hooks.py`). Keys are dotted as in YAML files and command-line "
        "overrides (`rlkit train quickstart grpo.num_prompts_per_step=8`) and in `Session.configure([...])`; "
        "in Python, `config.policy.optimizer.lr`.",
        "",
        "- **default**: the value in a run when nothing sets it (a preset such as `quickstart` sets many; "
        "`rlkit.config.loading` shows how presets, files and overrides stack).",
        "- **bounds**: what validation accepts; every problem of a config is reported at once, before any model "
        "loads.",
        "- **NeMo-RL**: key names follow NeMo-RL where it has the knob. The column shows what the schema itself "
        "records: another NeMo-RL name (e.g. `reference_policy_kl_type`), or *same* where the source marks the "
        "key as NeMo-RL's. Blank means the schema records nothing, not that NeMo-RL lacks the key.",
        "- **configure()**: what `Session.configure([...])` does with a new value, from `rlkit.config.changes` (the "
        "table `configure` itself reads, so this column cannot drift): *live* (read where it is used), *applied* "
        "with what it rebuilds (a rollout source, the loss, the optimizer: the engines stay up), *reset()* (a new "
        "run from step 0, `session.reset([...])`) or *new Session* (`Session.from_config(..., overrides)`: the "
        "engines, data or environment were built from it).",
        "- **note**: the comment the source gives the key.",
        "",
    ]
    lines += section_lines(RunConfig, RunConfig(), "")
    return "\n".join(lines) + "\n"


def section_lines(cls, instance, prefix: str) -> list[str]:
    title = prefix.rstrip(".") or "top level"
    level = "#" * min(2 + prefix.count("."), 4)
    out = [f"{level} `{title}`" if prefix else f"{level} Top level", ""]
    doc = clean(inspect.getdoc(cls) or "") if prefix else ""
    if doc and cls.__module__.startswith("rlkit"):
        out += [doc.replace("\n", " "), ""]
    out += [f"*{cls.__name__}* in `{cls.__module__}`", ""]
    rows, nested = [], []
    comments = field_comments(cls)
    for name, annotation, field_info in fields_of(cls):
        value = getattr(instance, name)
        if is_section(value):
            nested.append((name, value))
            continue
        note = comments.get(name, "")
        rows.append([f"`{prefix}{name}`", code(fmt_type(annotation)), code(fmt_value(value)), bounds(field_info),
                     nemo_rl_name(note), configure_word(f"{prefix}{name}"), cell(note)])
    if rows:
        out += ["| key | type | default | bounds | NeMo-RL | configure() | note |", "|---|---|---|---|---|---|---|"]
        out += ["| " + " | ".join(r) + " |" for r in rows]
        out.append("")
    for name, value in nested:
        out += section_lines(type(value), value, f"{prefix}{name}.")
    return out


def configure_word(key: str) -> str:
    """What ``Session.configure`` does with a new value of ``key``, in the reference's words."""
    from rlkit.config.changes import Change, change_for

    return {Change.LIVE: "live", Change.ROLLOUTS: "applied: new rollout source", Change.LOSS: "applied: new loss",
            Change.OPTIMIZER: "applied: new optimizer", Change.MODELS: "applied: critic or teacher built or released",
            Change.RUN: "reset()",
            Change.SESSION: "new Session"}[change_for(key)]


def is_section(value: Any) -> bool:
    from pydantic import BaseModel

    return isinstance(value, BaseModel) or (dataclasses.is_dataclass(value) and not isinstance(value, type))


def fields_of(cls):
    """(name, annotation, pydantic FieldInfo or None) of a pydantic model's or a dataclass's fields."""
    from pydantic import BaseModel

    if issubclass(cls, BaseModel):
        return [(n, f.annotation, f) for n, f in cls.model_fields.items()]
    hints = get_type_hints(cls)
    return [(f.name, hints.get(f.name, f.type), None) for f in dataclasses.fields(cls)]


def field_comments(cls) -> dict[str, str]:
    """Each field's comment in the class source: the comment lines just above it and the one on its line."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    trailing = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            trailing[tok.start[0]] = (tok.start[1], tok.string.lstrip("#").strip())
    out = {}
    body = ast.parse(source).body[0].body
    for node in body:
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        parts = []
        above = node.lineno - 1
        while above >= 1 and lines[above - 1].strip().startswith("#"):
            parts.insert(0, lines[above - 1].strip().lstrip("#").strip())
            above -= 1
        for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
            if line in trailing and trailing[line][0] > 0 and not lines[line - 1].strip().startswith("#"):
                parts.append(trailing[line][1])
        out[node.target.id] = " ".join(p for p in parts if p)
    return out


def fmt_type(t: Any) -> str:
    origin, args = get_origin(t), get_args(t)
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join(fmt_type(a) for a in args)
    if t is type(None):
        return "None"
    if isinstance(t, (list, tuple)):  # a Callable's parameter list
        return f"[{', '.join(fmt_type(a) for a in t)}]"
    if origin is not None:
        name = getattr(origin, "__name__", str(origin).replace("typing.", ""))
        return f"{name}[{', '.join(fmt_type(a) for a in args)}]" if args else name
    if isinstance(t, type):
        return t.__name__
    return str(t).replace("typing.", "")


def fmt_value(value: Any) -> str:
    if callable(value) and not isinstance(value, type):
        return getattr(value, "__name__", repr(value))
    return repr(value)


def bounds(field_info) -> str:
    if field_info is None:
        return ""
    signs = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    out = []
    for item in field_info.metadata:
        for attr, sign in signs.items():
            if getattr(item, attr, None) is not None:
                out.append(f"{sign} {getattr(item, attr)}")
        if getattr(item, "pattern", None):
            out.append(f"matches `{item.pattern}`")
    return ", ".join(out)


def nemo_rl_name(note: str) -> str:
    m = re.search(r"NeMo-RL(?:'s)?:\s*`?([A-Za-z_][\w.]*)", note)
    if m:
        return f"`{m.group(1)}`"
    if re.search(r"NeMo-RL's (key|name)|NeMo-RL's and|and NeMo-RL's", note):
        return "same"
    return ""


def clean(text: str) -> str:
    """reST roles and double backticks as Markdown code."""
    text = re.sub(r":(?:class|mod|func|meth|attr|data|obj):`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def code(text: str) -> str:
    return f"`{text}`" if "`" not in text else f"<code>{escape_html(text)}</code>"


def cell(text: str) -> str:
    return clean(text).replace("|", "\\|")


def escape_html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "&#124;")
