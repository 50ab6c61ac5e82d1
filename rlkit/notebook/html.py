"""Small HTML renderers for notebook displays. They format what an object already holds; no compute.

Everything returns a string of self-contained HTML (inline styles, no scripts), so the same output works in
JupyterLab, in a saved notebook, inside an ``ipywidgets.HTML`` and in a static export.
"""

from __future__ import annotations

import html
import math
from typing import Iterable, Mapping, Optional, Sequence

STYLE = "border-collapse:collapse;font-family:monospace;font-size:12px"
CELL = "border:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top"
MUTED = "color:#888"


def esc(value: object) -> str:
    return html.escape(str(value))


class CodeRepr:
    """A ``_repr_html_`` for objects whose text ``repr`` says it all: that text, escaped, as ``<code>``."""

    def _repr_html_(self) -> str:
        return f"<code>{esc(repr(self))}</code>"


def fmt(value: object) -> str:
    """Numbers to 4 significant digits, everything else as text (HTML-escaped)."""
    if isinstance(value, bool) or value is None:
        return esc("-" if value is None else value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return esc(value)


def table(header: Sequence[str], rows: Iterable[Sequence], caption: str = "", raw_columns: Sequence[int] = ()) -> str:
    """A compact table. Cells are escaped, except those in ``raw_columns`` (already HTML)."""
    head = "".join(f"<th style='{CELL}'>{esc(h)}</th>" for h in header) if any(header) else ""
    body = "".join(
        "<tr>" + "".join(f"<td style='{CELL}'>{v if i in raw_columns else fmt(v)}</td>" for i, v in enumerate(row))
        + "</tr>"
        for row in rows
    )
    cap = f"<caption style='text-align:left;caption-side:top'><b>{esc(caption)}</b></caption>" if caption else ""
    return f"<table style='{STYLE}'>{cap}{'<tr>' + head + '</tr>' if head else ''}{body}</table>"


def fitted(content: str) -> str:
    """``content`` no wider than the notebook: a wider table scrolls sideways inside its own box."""
    return f"<div style='max-width:100%;overflow-x:auto'>{content}</div>"


def key_values(caption: str, items: Mapping[str, object]) -> str:
    return table(["", ""], items.items(), caption)


def metrics_table(caption: str, values: Mapping[str, float]) -> str:
    """Metrics grouped by their prefix (``rollout/``, ``train/``, ``timing/`` ...), one column per group."""
    groups: dict[str, list[tuple[str, float]]] = {}
    for key in sorted(values):
        prefix, _, name = key.rpartition("/")
        groups.setdefault(prefix or "other", []).append((name, values[key]))
    columns = "".join(
        f"<div style='margin-right:12px'>{table(['', ''], rows, prefix)}</div>" for prefix, rows in groups.items()
    )
    return (f"<div><b style='font-family:monospace'>{esc(caption)}</b>"
            f"<div style='display:flex;flex-wrap:wrap;align-items:flex-start'>{columns}</div></div>")


# ---- colour scales -------------------------------------------------------------------------------------
def diverging(value: float, scale: float) -> str:
    """Green for positive, red for negative, transparent at 0; ``scale`` maps to full colour."""
    if not scale or not math.isfinite(value):
        return "transparent"
    a = min(abs(value) / scale, 1.0) * 0.85
    return f"rgba(0,150,60,{a:.2f})" if value > 0 else f"rgba(210,40,40,{a:.2f})"


def sequential(value: float, scale: float, log_floor: Optional[float] = None) -> str:
    """Transparent at 0, full orange-red at ``scale``; with ``log_floor``, on a log axis from it to ``scale``."""
    if not scale or not math.isfinite(value) or value <= 0:
        return "transparent"
    if log_floor is not None:
        a = (math.log10(max(value, log_floor)) - math.log10(log_floor)) / (math.log10(scale) - math.log10(log_floor))
    else:
        a = value / scale
    return f"rgba(230,90,20,{min(max(a, 0.0), 1.0) * 0.85:.2f})"


def token_span(text: str, background: str, tooltip: str) -> str:
    shown = esc(text).replace("\n", "\u21b5").replace(" ", "\u2423") or "\u2205"
    return (f"<span title='{esc(tooltip)}' style='background:{background};padding:1px 1px;margin:0 1px;"
            f"border-radius:2px;font-family:monospace'>{shown}</span>")


def legend(items: Sequence[tuple[str, str]]) -> str:
    """Colour swatches with labels: ``[(css colour, label), ...]``."""
    return " ".join(
        f"<span style='background:{c};font-family:monospace;font-size:11px;padding:0 4px'>{esc(label)}</span>"
        for c, label in items
    )
