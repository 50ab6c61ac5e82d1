"""Sizes and counts in the unit that shows them: ``bytes_text(3 * 2**20) == "3.00 MiB"``, ``count_text(103_456)
== "103K"``. Why: one fixed unit prints a nano model's 400 KiB as "0.00 GiB" and its 0.1M parameters as "0M".

Three significant figures at most (two decimals below 10, one below 100, none above); binary prefixes for bytes
(KiB = 1024 B, as the memory plan and ``free`` count), decimal ones for counts (K = 1000, M, B as model cards say).
"""

from __future__ import annotations

BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
COUNT_UNITS = ("", "K", "M", "B", "T")


def _scaled(value: float, base: int, units: tuple[str, ...], space: str) -> str:
    step = 0
    while abs(value) >= base and step < len(units) - 1:
        value, step = value / base, step + 1
    if step == 0:
        return f"{value:.0f}{space}{units[0]}".rstrip()
    digits = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
    return f"{value:.{digits}f}{space}{units[step]}"


def bytes_text(n: float) -> str:
    """``n`` bytes in B, KiB, MiB, GiB or TiB, whichever shows the figure: 512 B, 3.00 MiB, 12.3 GiB."""
    return _scaled(n, 1024, BYTE_UNITS, " ")


def count_text(n: float) -> str:
    """A count (of parameters, tokens) with K, M, B or T: 640, 103K, 1.50M, 135M, 7.00B."""
    return _scaled(n, 1000, COUNT_UNITS, "")
