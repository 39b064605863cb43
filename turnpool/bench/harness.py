"""What every ``turnpool bench`` command shares: machine info, the ``--json``/``--plot``
options, and the tail that measures under a status line, prints the tables and writes files.

A benchmark module only says what it measures (``run_benchmark``) and how it reads
(``render``); its report lands in JSON the same way everywhere, so reports of different
benchmarks can be read side by side.
"""

from __future__ import annotations

import json
import logging
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console

F = TypeVar("F", bound=Callable[..., Any])
Report = dict[str, Any]
Progress = Callable[[str], None]


def machine_info(**extra: Any) -> dict[str, Any]:
    """Where a report was measured: cores, Python, platform, plus ``extra`` fields."""
    return {"cpu_count": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), **extra}


def json_option(help: str) -> Callable[[F], F]:
    """The ``--json PATH`` option (``json_path``)."""
    return click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
                        default=None, help=help)


def plot_option(help: str) -> Callable[[F], F]:
    """The ``--plot PATH`` option (``plot_path``)."""
    return click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
                        default=None, help=help)


def start(width: int | None = None) -> Console:
    """Quiet logging and a console (``width`` when the output is not a terminal)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    console = Console()
    if width is not None and not console.is_terminal:  # a log or a pipe: keep columns readable
        console = Console(width=width)
    return console


def measure_and_print(console: Console, measure: Callable[[Progress], Report],
                      render: Callable[[Report], list[Any]]) -> Report:
    """Run ``measure`` under a status line, then print what ``render`` makes of its report."""
    with console.status("measuring...") as status:
        report = measure(lambda what: status.update(f"measuring {what}"))
    for item in render(report):
        console.print(item)
    return report


def write_outputs(console: Console, report: Report, json_path: Path | None,
                  plot_path: Path | None = None,
                  plot: Callable[[Report, Path], None] | None = None) -> None:
    """Write the report as JSON and, with ``plot``, as a PNG; say where."""
    if json_path:
        json_path.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
        console.print(f"wrote {json_path}")
    if plot_path and plot is not None:
        plot(report, plot_path)
        console.print(f"wrote {plot_path}")
