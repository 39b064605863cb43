"""Tables that fit the terminal: the full table when it fits, else one block per row.

Output is for people, and a table squeezed into 80 columns (the width of a pipe or a log, and
of many terminals) truncates its headers to ``succ…`` or breaks words. `fit` measures a
table's natural width first and, when it does not fit, prints the same rows vertically: the
first cell as a heading, then one ``header  value`` line per column, wrapped at spaces.

Example:
    >>> from rich.console import Console
    >>> console = Console(width=30, color_system=None)
    >>> table = make_table("t", ["tag", "success", "pass@16"], [["Bandit", "0.5", "0.9"]])
    >>> with console.capture() as cap:
    ...     console.print(fit(console, table))
    >>> "success" in cap.get() and "…" not in cap.get()
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text


def make_table(title: str | None, headers: Sequence[str], rows: Sequence[Sequence[Any]],
               right: Sequence[str] = ()) -> Table:
    """A compact table (no rules, bold headers); columns named in ``right`` align right.
    Cells are plain text, never rich markup (``pip install 'turnpool[bench]'`` keeps its
    brackets)."""
    table = Table(title=title, title_justify="left", box=None, pad_edge=False,
                  header_style="bold")
    for h in headers:
        table.add_column(h, justify="right" if h in right else "left", no_wrap=True)
    for row in rows:
        table.add_row(*(c if isinstance(c, Text) else Text(str(c)) for c in row))
    return table


def fits(console: Console, table: Table) -> bool:
    """Does ``table`` render at its natural width (no wrapped cell, no cut header)?"""
    unbounded = console.options.update_width(1 << 16)
    return Measurement.get(console, unbounded, table).maximum <= console.width


def vertical(table: Table) -> RenderableType:
    """The rows of ``table`` as blocks: the first cell as a heading, then ``header  value``."""
    columns = table.columns
    cells = [list(c.cells) for c in columns]
    n_rows = len(cells[0]) if cells else 0
    blocks: list[RenderableType] = []
    if table.title:
        blocks.append(Text(str(table.title), style="italic"))
    width = max((len(str(c.header)) for c in columns[1:]), default=0)
    for r in range(n_rows):
        grid = Table.grid(padding=(0, 2))
        grid.add_column(no_wrap=True, min_width=width, style="dim")
        grid.add_column(overflow="fold")
        for c in range(1, len(columns)):
            grid.add_row(str(columns[c].header), cells[c][r])
        blocks.append(Group(Text(str(cells[0][r]), style="bold"), grid, Text("")))
    return Group(*blocks)


def fit(console: Console, table: Table) -> RenderableType:
    """``table`` when it fits ``console``, else `vertical` ``table``."""
    return table if fits(console, table) else vertical(table)


__all__ = ["fit", "fits", "make_table", "vertical"]
