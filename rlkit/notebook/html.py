"""Small HTML renderers for notebook displays. They format what an object already holds; no compute."""

from __future__ import annotations

import html
from typing import Iterable, Mapping, Sequence

STYLE = "border-collapse:collapse;font-family:monospace;font-size:12px"
CELL = "border:1px solid #ddd;padding:2px 6px;text-align:left"


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape(str(value))


def table(header: Sequence[str], rows: Iterable[Sequence], caption: str = "") -> str:
    head = "".join(f"<th style='{CELL}'>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td style='{CELL}'>{_fmt(v)}</td>" for v in row) + "</tr>" for row in rows)
    cap = f"<caption style='text-align:left'><b>{html.escape(caption)}</b></caption>" if caption else ""
    return f"<table style='{STYLE}'>{cap}<tr>{head}</tr>{body}</table>"


def metrics_table(caption: str, values: Mapping[str, float]) -> str:
    return table(["metric", "value"], sorted(values.items()), caption)


def key_values(caption: str, items: Mapping[str, object]) -> str:
    return table(["", ""], items.items(), caption)
