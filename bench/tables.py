"""The figures a bench prints: the rows of the markdown tables on its stdout.

This is the one convention every script in ``bench/`` follows, so that ``bench/ab.py`` can compare
two trees and the smoke tests can tell a bench that printed its table from one that did not::

    | case | records | M points / CPU-s | p99 ms |     <- header: a figure's unit is in its header
    |---|---:|---:|---:|                             <- alignment row
    | columns | 1,024 | 3.41 | 12.0 |

- Left-aligned columns (``---``) name the row; right-aligned columns (``---:``) hold figures. A
  cell's figure is the number it starts with (``1,024``, ``12.0 ms``, ``3 (0.25)``); a cell that
  starts with no number is no figure.
- When the left-aligned cells of two rows of one table are the same (``columns | 1 | ingest`` and
  ``columns | 1,024 | ingest``: the size is a right-aligned number), every row of that table is
  also named by its first right-aligned cell, which is then a name and not a figure.
- A table is named by its first header cell, so two tables of one output stay apart.

Text around the tables (progress, notes, prose) is for people and is ignored. Older trees follow
the convention where they printed markdown tables (``bench/ingest.py`` has since 91dd201).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_ALIGN = re.compile(r"^\|(\s*:?-+:?\s*\|)+\s*$")
_NUMBER = re.compile(r"^[-+]?(\d[\d,]*\.?\d*|\.\d+)([eE][-+]?\d+)?")


@dataclass(frozen=True)
class Figure:
    table: str     # the table's first header cell
    row: str       # its naming cells, joined by " · "
    column: str    # the figure's header (its unit)
    value: float

    @property
    def key(self) -> tuple[str, str, str]:
        return self.table, self.row, self.column


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def number(cell: str) -> float | None:
    """The number a cell starts with (thousands separators allowed), or None."""
    m = _NUMBER.match(cell.strip())
    return float(m.group(0).replace(",", "")) if m else None


def parse(text: str) -> list[Figure]:
    """Every figure of every markdown table in ``text``, in the order printed."""
    lines = text.splitlines()
    figures: list[Figure] = []
    i = 1
    while i < len(lines):
        if not (_ALIGN.match(lines[i].strip()) and lines[i - 1].lstrip().startswith("|")):
            i += 1
            continue
        header = cells(lines[i - 1])
        right = [c.endswith(":") and not c.startswith(":") for c in cells(lines[i])]
        body = []
        i += 1
        while i < len(lines) and lines[i].lstrip().startswith("|"):
            body.append(cells(lines[i]))
            i += 1
        figures += _table_figures(header, right, body)
    return figures


def _table_figures(header: list[str], right: list[bool], body: list[list[str]]) -> list[Figure]:
    n = min(len(header), len(right))
    label_cols = [j for j in range(n) if not right[j]]
    names = [" · ".join(r[j] for j in label_cols if j < len(r) and r[j]) for r in body]
    first_figure = next((j for j in range(n) if right[j]), None)
    # Names that repeat: the whole table is named by its first figure column too, so a row's name
    # does not depend on which other rows a run printed.
    by_size = len(set(names)) < len(names) and first_figure is not None
    out = []
    for r, name in zip(body, names):
        cols = [j for j in range(n) if right[j] and j < len(r)]
        if by_size and first_figure < len(r):
            name = f"{name} · {header[first_figure]} {r[first_figure]}"
            cols = [j for j in cols if j != first_figure]
        for j in cols:
            value = number(r[j])
            if value is not None:
                out.append(Figure(header[0], name, header[j], value))
    return out
