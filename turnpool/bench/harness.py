"""What every ``turnpool bench`` command shares: machine info, the ``--json``/``--plot``
options, and the tail that measures under a progress bar, prints the tables and writes files.

Progress goes to stderr: a bar on a terminal, one line per step otherwise (a log or a pipe
shows that a long benchmark is alive). Tables are printed with `turnpool.cli.layout.fit`, so
they never cut their headers at 80 columns.

A benchmark module only says what it measures (``run_benchmark``) and how it reads
(``render``); its report lands in JSON the same way everywhere, so reports of different
benchmarks can be read side by side.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from turnpool.cli.layout import fit

F = TypeVar("F", bound=Callable[..., Any])
Report = dict[str, Any]


class ProgressFn(Protocol):
    """``progress(what)``, or ``progress(what, done, total)`` when the count is known."""

    def __call__(self, what: str, done: int | None = None, total: int | None = None) -> None:
        ...


def machine_info(**extra: Any) -> dict[str, Any]:
    """Where a report was measured: cores, Python, platform, plus ``extra`` fields."""
    return {"cpu_count": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), **extra}


def python_speed(iterations: int = 100_000, repeats: int = 3) -> float:
    """This machine's pure-Python speed now: CPU nanoseconds per iteration of a fixed loop
    (the ``cpu`` env's arithmetic), best of ``repeats``; ~50 ms.

    A shared or virtual machine's speed moves by tens of percent within minutes, and every
    absolute µs in a report moves with it; benches with µs goals record this before and
    after their run (`speed_text`), so a number can be read against the speed it was taken
    at. Side-by-side ratios need no such help.
    """
    best = float("inf")
    for _ in range(repeats):
        t0 = time.thread_time_ns()
        acc = 0
        for i in range(iterations):
            acc = (acc + i * i) % 1_000_003
        best = min(best, time.thread_time_ns() - t0)
    return best / iterations


def speed_text(machine: dict[str, Any]) -> str | None:
    """The report line for ``machine["python_ns_per_iter"]`` (`python_speed` before, after)."""
    speed = machine.get("python_ns_per_iter")
    if not speed:
        return None
    return ("pure-Python speed of this machine (a fixed loop, CPU ns per iteration, before / "
            "after the run; absolute µs scale with it): " +
            " / ".join(f"{v:.0f}" for v in speed))


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


@contextmanager
def progress_reporter(err: Console | None = None) -> Iterator[ProgressFn]:
    """A `ProgressFn` that draws a bar on a terminal and prints lines elsewhere (stderr)."""
    err = err or Console(stderr=True)
    if not err.is_terminal:
        def line(what: str, done: int | None = None, total: int | None = None) -> None:
            count = f"[{done}/{total}] " if done is not None and total else ""
            err.print(f"{count}measuring {what}", highlight=False, soft_wrap=True)
        yield line
        return
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=err, transient=True)
    with bar:
        task = bar.add_task("measuring", total=None)

        def update(what: str, done: int | None = None, total: int | None = None) -> None:
            bar.update(task, description=f"measuring {what}", completed=done or 0, total=total)
        yield update


def measure_and_print(console: Console, measure: Callable[[ProgressFn], Report],
                      render: Callable[[Report], list[Any]]) -> Report:
    """Run ``measure`` under a progress bar, then print what ``render`` makes of its report
    (tables fitted to the console's width)."""
    with progress_reporter() as progress:
        report = measure(progress)
    for item in render(report):
        console.print(fit(console, item) if isinstance(item, Table) else item)
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
