"""Tiny SVG charts and text sparklines for the dashboard: plain strings, no plotting library, no state.

Why not matplotlib: the dashboard redraws after every RL step, and a step of a tiny model takes a fraction
of a second; rendering an SVG string costs well under a millisecond, works inside an ``ipywidgets.HTML``,
in a saved notebook and without a display backend, and its points can be read back by a test.

Deliberate simplifications: linear axes only, min/max tick labels, at most ``MAX_POINTS`` points per
series (longer histories are thinned by striding, keeping the last point).
"""

from __future__ import annotations

import html
import math
from typing import Mapping, Sequence

MAX_POINTS = 400
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
SPARKS = "▁▂▃▄▅▆▇█"


def _thin(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    if len(xs) <= MAX_POINTS:
        return list(xs), list(ys)
    stride = math.ceil(len(xs) / MAX_POINTS)
    keep = list(range(len(xs) - 1, -1, -stride))[::-1]
    return [xs[i] for i in keep], [ys[i] for i in keep]


def _num(v: float, lo: float = 0.0, hi: float = 0.0) -> str:
    """``v`` with enough significant digits to tell ``lo`` from ``hi`` apart (3 at least)."""
    span, size = abs(hi - lo), max(abs(lo), abs(hi))
    digits = 3 if span == 0 or size == 0 else min(10, max(3, math.ceil(math.log10(size / span)) + 2))
    return f"{v:.{digits}g}"


def _axis_label(v: float, lo: float, hi: float) -> str:
    """Short enough for the margin: a range too narrow for 5 digits shows the top as an offset from the bottom."""
    text = _num(v, lo, hi)
    if len(text) <= 7:
        return text
    return f"{lo:.4g}" if v == lo else f"+{hi - lo:.2g}"


def line_chart(title: str, xs: Sequence[float], series: Mapping[str, Sequence[float]],
               width: int = 260, height: int = 140, note: str = "") -> str:
    """One panel: ``series`` (label -> y values aligned with ``xs``; NaN = missing) as lines. ``note``, if
    given, is written across the plot in grey (why a flat line is flat).

    The ``<svg>`` carries ``data-title`` and ``data-points`` (points of the first series) for tests.
    """
    left, right, top, bottom = 54, 8, 30, 18
    finite = [y for ys in series.values() for y in ys if y is not None and math.isfinite(y)]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    if hi - lo < 1e-12 * max(abs(hi), 1.0):
        lo, hi = lo - 0.5 * (abs(lo) or 1), hi + 0.5 * (abs(hi) or 1)
    x_lo, x_hi = (min(xs), max(xs)) if xs else (0, 1)
    x_span = (x_hi - x_lo) or 1

    def px(x: float) -> float:
        return left + (x - x_lo) / x_span * (width - left - right) if len(xs) > 1 else (left + width - right) / 2

    def py(y: float) -> float:
        return top + (hi - y) / (hi - lo) * (height - top - bottom)

    parts = [
        f"<rect x='{left}' y='{top}' width='{width - left - right}' height='{height - top - bottom}' "
        "fill='none' stroke='#ddd'/>",
        f"<text x='{left - 3}' y='{top + 8}' text-anchor='end'>{_axis_label(hi, lo, hi)}</text>",
        f"<text x='{left - 3}' y='{height - bottom}' text-anchor='end'>{_axis_label(lo, lo, hi)}</text>",
    ]
    if xs:
        parts.append(f"<text x='{left}' y='{height - 4}'>{_num(x_lo)}</text>")
        parts.append(f"<text x='{width - right}' y='{height - 4}' text-anchor='end'>step {_num(x_hi)}</text>")
    if not finite or note:
        parts.append(f"<text class='rlkit-chart-note' x='{(left + width - right) / 2}' y='{(top + height - bottom) / 2 - 4}' "
                     f"text-anchor='middle' fill='#999'>{html.escape(note or 'no data yet')}</text>")
    first_points = 0
    latest = []
    for k, (label, ys) in enumerate(series.items()):
        tx, ty = _thin(xs, ys)
        pts = [(px(x), py(y)) for x, y in zip(tx, ty) if y is not None and math.isfinite(y)]
        if k == 0:
            first_points = len(pts)
        color = PALETTE[k % len(PALETTE)]
        if len(pts) == 1:
            parts.append(f"<circle cx='{pts[0][0]:.1f}' cy='{pts[0][1]:.1f}' r='2.5' fill='{color}'/>")
        elif pts:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
            parts.append(f"<polyline points='{path}' fill='none' stroke='{color}' stroke-width='1.5'/>")
        last = next((y for y in reversed(list(ys)) if y is not None and math.isfinite(y)), None)
        if last is not None:
            latest.append(f"<tspan fill='{color}'>{html.escape(label)} {_num(last, lo, hi)}</tspan>")
    header = f"<text x='{left}' y='11' font-weight='bold'>{html.escape(title)}</text>"
    values = f"<text x='{left}' y='24'>{'  '.join(latest)}</text>"
    return (f"<svg class='rlkit-chart' data-title='{html.escape(title)}' data-points='{first_points}' "
            f"width='{width}' height='{height}' font-family='monospace' font-size='10' "
            f"xmlns='http://www.w3.org/2000/svg'>{header}{values}{''.join(parts)}</svg>")


def stacked_bars(title: str, xs: Sequence[float], parts: Mapping[str, Sequence[float]],
                 width: int = 788, height: int = 130) -> str:
    """Stacked bars per x (e.g. seconds per stage per step), with a legend of each part's last value.

    The axis runs from 0 to the tallest bar shown, and says which one that is: its top is the dashed line the
    maximum is written against, so the scale is always reached by a bar you can see. No bars, no scale.
    """
    left, right, top, bottom = 54, 8, 18, 18
    n = len(xs)
    keep = list(range(max(0, n - 120), n))  # the last 120 steps: bars need room
    totals = [sum(max(float(parts[k][i] or 0.0), 0.0) for k in parts) for i in keep]
    hi = max(totals) if totals and max(totals) > 0 else 0.0
    tallest = keep[totals.index(hi)] if hi > 0 else None
    hi = hi or 1.0
    slot = (width - left - right) / max(len(keep), 1)
    bars = []
    for j, i in enumerate(keep):
        y = height - bottom
        for k, (label, values) in enumerate(parts.items()):
            v = max(float(values[i] or 0.0), 0.0)
            h = v / hi * (height - top - bottom)
            y -= h
            bars.append(f"<rect x='{left + j * slot:.1f}' y='{y:.1f}' width='{max(slot - 1, 0.5):.1f}' "
                        f"height='{h:.1f}' fill='{PALETTE[k % len(PALETTE)]}'><title>{html.escape(label)} "
                        f"{v:.3g}s (step {_num(xs[i])})</title></rect>")
    entries = [f"<tspan fill='{PALETTE[k % len(PALETTE)]}'>■ {html.escape(label)}"
               f"{' ' + _num(values[-1] or 0.0) + 's' if len(values) else ''}</tspan>"
               for k, (label, values) in enumerate(parts.items())]
    rows = [entries[i:i + 4] for i in range(0, len(entries), 4)]
    legend = "".join(f"<text x='{left}' y='{height - bottom + 14 + 13 * r}'>{'  '.join(row)}</text>"
                     for r, row in enumerate(rows))
    return (f"<svg class='rlkit-chart' data-title='{html.escape(title)}' data-points='{len(keep)}' "
            f"width='{width}' height='{height - bottom + 6 + 13 * max(len(rows), 1)}' font-family='monospace' "
            "font-size='10' xmlns='http://www.w3.org/2000/svg'>"
            f"<text x='{left}' y='12' font-weight='bold'>{html.escape(title)}</text>"
            f"{_bar_scale(tallest, xs, hi, left, width - right, top, height - bottom)}"
            f"{''.join(bars)}{legend}</svg>")


def _bar_scale(tallest: int | None, xs: Sequence[float], hi: float, x0: float, x1: float, top: float,
               base: float) -> str:
    """The bars' scale: 0 at the base, the tallest bar's value on a dashed line at its top (``tallest``: its
    index in ``xs``, None when there are no bars: "no data yet" instead of a scale)."""
    if tallest is None:
        return (f"<text x='{(x0 + x1) / 2}' y='{(top + base) / 2}' text-anchor='middle' fill='#999'>"
                "no data yet</text>")
    return (f"<line class='rlkit-chart-max' x1='{x0}' y1='{top}' x2='{x1}' y2='{top}' stroke='#bbb' "
            f"stroke-dasharray='3,3'/>"
            f"<text x='{x0 - 3}' y='{top}' dominant-baseline='middle' text-anchor='end'>{_num(hi)}s</text>"
            f"<text x='{x1}' y='12' text-anchor='end' fill='#888'>tallest: step {_num(xs[tallest])}, "
            f"{_num(hi)} s</text>"
            f"<text x='{x0 - 3}' y='{base}' text-anchor='end'>0</text>")


def sparkline(values: Sequence[float], width: int = 24) -> str:
    """A one-line text chart of the last ``width`` values (``▁▂▃▄▅▆▇█``)."""
    ys = [v for v in values if v is not None and math.isfinite(v)][-width:]
    if not ys:
        return ""
    lo, hi = min(ys), max(ys)
    if hi - lo < 1e-12:
        return SPARKS[3] * len(ys)
    return "".join(SPARKS[round((y - lo) / (hi - lo) * (len(SPARKS) - 1))] for y in ys)
