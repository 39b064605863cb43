"""``turnpool replay``: re-run every env transition of a record and compare, byte for byte.

    turnpool rollout turnpool.collector.mode=async --record run.jsonl.gz
    turnpool replay run.jsonl.gz                       # exit 0: every transition the same
    turnpool replay run.jsonl.gz --backend process --workers 4 --json replay.json

The record (`turnpool.rollout.record`) holds each episode attempt's env, seed, the actions
sent and what the pool returned; the replay (`turnpool.rollout.replay`) rebuilds the recorded
pool layout on any backend, resets each env with its seed, steps the recorded actions (no
policy runs) and compares every reset and step. It prints the counts (episodes, transitions
compared and not compared, divergent episodes, time, transitions/s).

Exit codes: 0 every transition replayed byte-identical; 1 a divergence (the line names the
first one in the file: episode, env, seed, turn, field, recorded vs replayed, shortened), or
envs that cannot be built; 2 a file that is not a record (or a damaged one), a missing extra,
a backend that cannot start; 130 interrupted.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from turnpool.backends import BACKENDS
from turnpool.cli.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    UserError,
    missing_extra,
    unknown_env,
)
from turnpool.cli.layout import fit, make_table
from turnpool.pool.api import EnvConstructionError
from turnpool.rollout.record import RecordError, read_record
from turnpool.rollout.replay import ReplayReport, replay_records

_EPILOG = """\b
Examples:
  turnpool rollout --record run.jsonl.gz turnpool.collector.mode=async
  turnpool replay run.jsonl.gz
  turnpool replay run.jsonl.gz --backend process --workers 4 --json replay.json
"""


@click.command(epilog=_EPILOG)
@click.argument("record", type=click.Path(dir_okay=False))
@click.option("--backend", type=click.Choice(list(BACKENDS)), default="sequential",
              show_default=True, help="Where the replayed envs run (any backend replays a "
                                      "record of any other).")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Worker count (default: the backend's).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the counts (and the first divergence) as JSON.")
def replay(record: str, backend: str, workers: int | None, json_path: str | None) -> None:
    """Re-run every env transition of RECORD (written by turnpool rollout --record) and
    exit 0 only if all are byte-identical."""
    start = time.perf_counter()
    try:
        header, records = read_record(record)
    except (FileNotFoundError, IsADirectoryError) as exc:
        raise UserError(f"{record}: no such file", EXIT_USAGE) from exc
    except RecordError as exc:
        raise UserError(str(exc), EXIT_USAGE) from exc
    for spec in header.specs:  # an env this install does not have: before any env starts
        problem = unknown_env(str(spec.env_type))
        if problem:
            records.close()
            raise UserError(f"{record}: tag {spec.tag}: {problem}", EXIT_USAGE)
    try:
        report = replay_records(header, records, backend=backend, num_workers=workers,
                                started=start)
    except RecordError as exc:
        raise UserError(str(exc), EXIT_USAGE) from exc
    except EnvConstructionError as exc:
        missing = missing_extra(exc, "replay")
        raise (UserError(str(missing), EXIT_USAGE) if missing
               else UserError(f"{record}: {exc}", EXIT_FAILED)) from exc
    except KeyboardInterrupt:
        raise UserError("replay interrupted", EXIT_INTERRUPTED) from None
    console = Console()
    console.print(fit(console, report_table(report, record)))
    if json_path:
        Path(json_path).write_text(json.dumps(report.to_dict(), indent=2, sort_keys=True)
                                   + "\n", encoding="utf-8")
    if report.first is not None:
        more = report.divergent - 1
        raise UserError(f"first divergence: {report.first.describe()}"
                        + (f" ({more} more episode(s) diverged)" if more else ""), EXIT_FAILED)


def report_table(report: ReplayReport, record: str) -> Table:
    """The counts of a replay, one quantity a row."""
    h = report.header
    rows = [
        ("record", f"{record} (turnpool {h.turnpool}, {h.collector_mode} collector)"),
        ("backend", f"{report.backend} ({report.num_workers} worker"
                    f"{'s' if report.num_workers != 1 else ''})"),
        ("episodes", f"{report.episodes}"),
        ("transitions compared", f"{report.transitions}"),
        ("not compared", f"{report.not_compared}"),
        ("divergent episodes", f"{report.divergent}"),
        ("time", f"{report.wall_s:.2f} s"),
        ("transitions/s", f"{report.transitions_per_s:,.0f}"),
    ]
    return make_table("replay", ["quantity", "value"], rows, right=["value"])
