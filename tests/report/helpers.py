"""Small readers for the report's tables in tests: a table by key, a row by its first cell,
and the numbers printed in a cell."""

from __future__ import annotations

import re

from report.tables import Table
from report.write import Written

__all__ = ["cell", "numbers", "row", "table"]

_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")


def table(written: Written, key: str) -> Table:
    found = [t for t in written.tables if t.key == key]
    assert found, f"no table {key!r}; have {[t.key for t in written.tables]}"
    return found[0]


def row(t: Table, first: str) -> dict[str, str]:
    for r in t.rows:
        if r[0] == first:
            return dict(zip(t.columns, r, strict=True))
    raise AssertionError(f"{t.key}: no row {first!r}; rows {[r[0] for r in t.rows]}")


def cell(t: Table, first: str, column: str) -> str:
    return row(t, first)[column]


def numbers(text: str) -> list[float]:
    """Every number printed in a cell, thousands separators removed."""
    return [float(n.replace(",", "")) for n in _NUMBER.findall(text)]
