"""``turnpool rollout``: collect one batch from a config and print where the time went.

    turnpool rollout                                   # Sokoban 8 groups x 16, oracle policy
    turnpool rollout --env sudoku --policy random --groups 4 --group-size 8
    turnpool rollout --config configs/frozen_lake.yaml agent_proxy.max_turn=8 \\
        --json summary.json --out trajectories.jsonl
    turnpool rollout --backend process --workers 4 --policy random --seed 7
    turnpool rollout turnpool.collector.tree.mode=best_of_n --out t.jsonl --tree-out tree.jsonl
    turnpool rollout turnpool.collector.mode=async --record run.jsonl.gz   # then:
    turnpool replay run.jsonl.gz

``--env``, ``--groups`` and ``--group-size`` choose the env and the batch's size
(`turnpool.cli.choose`); ``--backend``, ``--workers`` and ``--policy`` are shorthands for the
dotlist keys ``turnpool.backend``, ``turnpool.num_workers`` and ``turnpool.policy.name``.

The rollout summary (stdout) has one row per tag (success, pass@k, valid-action ratio, format
penalty rate, mean actions, errors) and the time split: env-steps/s, env time vs policy time,
env time per turn. The progress bar goes to stderr.

``--record FILE`` writes every episode attempt's env transitions (env, seed, actions sent, what
the pool returned; `turnpool.rollout.record`), in lock-step and async mode, over all
``--batches``; ``turnpool replay FILE`` re-runs and compares them (`turnpool.cli.replay`).

Exit codes (each failure is one readable line on stderr): 0 success; 1 the run failed (envs
that cannot be built, dynamic sampling out of budget); 2 invalid config or arguments (an
unknown env, a missing optional dependency: the line names its pip extra); 3 the
policy endpoint cannot be reached; 4 more than ``--max-failed-fraction`` of the episodes
failed for good (after retries; the summary is still printed and written); 130 interrupted
(Ctrl-C: the pool is closed at once and the JSONL holds the whole batches finished so far,
so whole GRPO groups only; the line says how many trajectories it holds).

With ``--batches N`` the summary and ``--json`` cover the whole run (``metrics``), with one
row per batch (``batches``); the progress bar counts the turns of every batch.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from turnpool.backends import BACKENDS
from turnpool.cli.choose import choice_overrides, load_plan, sugar_overrides
from turnpool.cli.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_POLICY_UNREACHABLE,
    EXIT_TOO_MANY_FAILURES,
    EXIT_USAGE,
    UserError,
    missing_extra,
)
from turnpool.cli.layout import fit, make_table
from turnpool.policies import policy_names
from turnpool.policies.base import PolicyUnreachable
from turnpool.pool.api import EnvConstructionError
from turnpool.rollout.collector import RolloutBatch, TrajectoryCollector
from turnpool.rollout.metrics import run_metrics
from turnpool.rollout.record import Recorder
from turnpool.rollout.sampling import BudgetExhausted
from turnpool.rollout.settings import RolloutPlan
from turnpool.rollout.trajectory import dumps
from turnpool.worker.failures import FAILURE_CLASSES

log = logging.getLogger(__name__)

#: without a terminal (a log, CI), progress is one line per this many seconds
PROGRESS_EVERY_S = 30.0
#: the --out formats: extension -> what writes it
OUT_FORMATS = (".jsonl", ".parquet")


class RolloutFailed(UserError):
    """One line on stderr and a specific exit code (`turnpool.cli.errors`)."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message, exit_code)


_EPILOG = """\b
Examples:
  turnpool rollout
  turnpool rollout --backend process --workers 4 --seed 7
  turnpool rollout --env sudoku --policy random --groups 4 --group-size 8
  turnpool rollout --policy random --groups 4 es_manager.train.group_size=8
  turnpool rollout --config configs/multi.yaml --json s.json --out t.jsonl
"""


@click.command(epilog=_EPILOG)
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="YAML config (RAGEN keys + turnpool keys); default: the packaged one.")
@click.argument("overrides", nargs=-1)
@click.option("--env", default=None,
              help="Run this registered env with its defaults (turnpool envs lists them), or "
                   "this tag of the config.")
@click.option("--groups", type=click.IntRange(min=1), default=None,
              help="Groups per batch (GRPO groups: members share a seed); shorthand for "
                   "es_manager.<mode>.env_groups=N.")
@click.option("--group-size", type=click.IntRange(min=1), default=None,
              help="Envs per group; shorthand for es_manager.<mode>.group_size=N.")
@click.option("--backend", type=click.Choice(list(BACKENDS)), default=None,
              help="Shorthand for turnpool.backend=...")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Shorthand for turnpool.num_workers=...; under the auto backend envs "
                   "that step in microseconds still run in this process (name --backend "
                   "process for worker processes).")
@click.option("--policy", type=click.Choice(policy_names()), default=None,
              help="Shorthand for turnpool.policy.name=...")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the summary (metrics, backend, config) as JSON.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False),
              help="Write the trajectories: .jsonl (one per line), or .parquet (needs "
                   "pyarrow: pip install 'turnpool[data]').")
@click.option("--tree-out", "tree_path", type=click.Path(dir_okay=False),
              help="Tree rollouts (turnpool.collector.tree.mode): write every node of the "
                   "trees as JSONL (node_id, parent_id, turn, score, kept, chosen, record).")
@click.option("--record", "record_path", type=click.Path(dir_okay=False),
              help="Record every env transition (JSONL; gzip if it ends in .gz) for "
                   "turnpool replay.")
@click.option("--mode", type=click.Choice(["train", "val"]), default="train", show_default=True,
              help="Which es_manager section to run.")
@click.option("--seed", type=int, default=None, help="Reset seed (default: seed.<mode>).")
@click.option("--progress/--no-progress", default=True, show_default=True,
              help="A progress bar on a terminal; without one, a line every "
                   f"{PROGRESS_EVERY_S:g} s.")
@click.option("--batches", type=click.IntRange(min=1), default=1, show_default=True,
              help="Collect this many batches; each is appended to --out as it completes.")
@click.option("--max-failed-fraction", type=click.FloatRange(0.0, 1.0), default=0.1,
              show_default=True,
              help="Exit with code 4 when more than this share of episodes failed for good.")
def rollout(config_path: str | None, overrides: tuple[str, ...], backend: str | None,
            workers: int | None, policy: str | None, json_path: str | None,
            out_path: str | None, mode: str, seed: int | None, progress: bool,
            batches: int = 1, max_failed_fraction: float = 0.1,
            tree_path: str | None = None, record_path: str | None = None,
            env: str | None = None, groups: int | None = None,
            group_size: int | None = None) -> None:
    """Collect one batch of trajectories and print a summary.

    OVERRIDES are dotted key=value pairs, e.g. es_manager.train.env_groups=4
    turnpool.policy.name=random turnpool.backend=process.
    """
    check_out_path(out_path)
    plan = load_plan(config_path, mode, (choice_overrides(env, groups, group_size, mode)
                                         + overrides + sugar_overrides(backend, workers, policy)),
                     env, overrides)
    console = Console()
    err_console = Console(stderr=True)
    t0 = time.perf_counter()
    collector = _build(plan)
    parquet = bool(out_path) and Path(str(out_path)).suffix.lower() == ".parquet"
    out = _WholeBatches(out_path) if out_path and not parquet else None
    results: list[RolloutBatch] = []
    try:
        with collector, _recording(collector, record_path) as recorder:
            _collect(collector, plan.collector.max_turn, seed, batches, progress,
                     err_console, results, out)
            backend, workers = collector.pool.backend_name, collector.pool.num_workers
            v2 = collector.settings.turn.ragen_version == "v2"
    except KeyboardInterrupt:
        done = out.batches if out is not None else len(results)
        where = (f"; wrote {out.trajectories} trajectories (whole groups) to {out_path}"
                 if out is not None else "")
        raise RolloutFailed(f"interrupted after {done} whole batch(es){where}",
                            EXIT_INTERRUPTED) from None
    except PolicyUnreachable as exc:
        raise RolloutFailed(str(exc), EXIT_POLICY_UNREACHABLE) from exc
    finally:
        if out is not None:
            out.close()
    if parquet and out_path:
        write_parquet([t for b in results for t in b.trajectories], Path(out_path))
    if tree_path:
        with open(tree_path, "w", encoding="utf-8") as fh:
            nodes = sum(b.write_tree(fh) for b in results)
    metrics = (results[0].metrics if len(results) == 1 else
               run_metrics([(b.trajectories, b.metrics) for b in results], plan.group_size,
                           v2=v2))
    tags, wall = [t.tag for t in plan.tags], time.perf_counter() - t0
    summary = {
        "mode": mode, "backend": backend, "num_workers": workers,
        "policy": plan.policy.get("name"), "group_size": plan.group_size,
        "num_groups": plan.num_groups, "max_turn": plan.collector.max_turn,
        "tags": tags, "wall_s": wall, "metrics": metrics,
        "batches": [{"batch": i, "trajectories": len(b.trajectories), "metrics": b.metrics}
                    for i, b in enumerate(results)],
        "trajectories_out": out_path,
    }
    console.print(fit(console, summary_table(metrics, tags, plan.group_size, len(results))))
    if len(results) > 1:
        console.print(fit(console, batches_table(results, tags)))
    console.print(fit(console, timing_table(metrics, backend, workers, wall)))
    if json_path:
        Path(json_path).write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n",
                                   encoding="utf-8")
    if out_path:
        total = sum(len(b.trajectories) for b in results)
        console.print(f"wrote {total} trajectories to {out_path}")
    if tree_path:
        console.print(f"wrote {nodes} tree nodes to {tree_path}")
    if recorder is not None:
        console.print(f"recorded {recorder.episodes} episode attempts to {record_path}",
                      soft_wrap=True)
    first_error = next((b.first_error for b in results if b.first_error), None)
    _check_failures(metrics, max_failed_fraction, first_error)


class _WholeBatches:
    """``--out`` JSONL written one whole batch at a time: however the run ends (Ctrl-C in the
    middle of a write included), the file ends after the last whole batch, so it holds whole
    GRPO groups only, and `trajectories` is exactly what it holds."""

    def __init__(self, path: str) -> None:
        self._fh = open(path, "wb")  # noqa: SIM115 - closed by close()
        self.batches = self.trajectories = 0
        self._mark = (0, 0, 0)  # bytes, batches, trajectories: one assignment, never torn

    def add(self, trajectories: list[Any]) -> None:
        self._fh.write("".join(dumps(t) + "\n" for t in trajectories).encode("utf-8"))
        self._fh.flush()
        self._mark = (self._fh.tell(), self._mark[1] + 1, self._mark[2] + len(trajectories))
        _, self.batches, self.trajectories = self._mark

    def close(self) -> None:
        if self._fh.closed:
            return
        size, self.batches, self.trajectories = self._mark
        self._fh.truncate(size)
        self._fh.close()


def _build(plan: RolloutPlan) -> TrajectoryCollector:
    """The plan's collector; `RolloutFailed` (usage, or a missing extra) when it cannot be
    built."""
    try:
        return TrajectoryCollector.from_plan(plan)
    except EnvConstructionError as exc:  # the config is fine; its envs cannot be built
        missing = missing_extra(exc, "rollout")  # ... for want of an extra, in a worker
        raise (RolloutFailed(str(missing), EXIT_USAGE) if missing
               else RolloutFailed(str(exc))) from exc
    except (ValueError, TypeError, FileNotFoundError) as exc:  # a value refused, a missing
        raise RolloutFailed(str(exc), EXIT_USAGE) from exc           # model folder


def _check_failures(metrics: dict[str, float], max_failed_fraction: float,
                    first_error: str | None = None) -> None:
    """`RolloutFailed` when more than ``max_failed_fraction`` of episodes failed for good,
    naming the first episode's cause."""
    failed = metrics.get("failures/unrecovered_fraction", 0.0)
    if failed > max_failed_fraction:
        classes = ", ".join(f"{name} {metrics[f'failures/{name}']:.0f}"
                            for name in FAILURE_CLASSES if metrics.get(f"failures/{name}"))
        first = f"; first: {first_error}" if first_error else ""
        raise RolloutFailed(f"{100 * failed:.0f}% of episodes failed after retries (more "
                            f"than --max-failed-fraction {max_failed_fraction:g}): {classes}"
                            f"{first}", EXIT_TOO_MANY_FAILURES)


@contextmanager
def _recording(collector: TrajectoryCollector, path: str | None
               ) -> Iterator[Recorder | None]:
    """Record the run to ``path`` (nothing without one): the file is closed, and holds
    every episode attempt finished so far, however the run ends."""
    if not path:
        yield None
        return
    from turnpool import __version__
    from turnpool.rollout.record import open_for_writing

    try:
        header = collector.record_header(__version__)
    except ValueError as exc:
        raise RolloutFailed(f"--record: {exc}", EXIT_USAGE) from exc
    try:
        fh = open_for_writing(path)
    except OSError as exc:
        raise RolloutFailed(f"--record {path}: {exc.strerror or exc}", EXIT_USAGE) from exc
    with fh:
        recorder = Recorder(fh, header)
        collector.record_to(recorder)
        try:
            yield recorder
        finally:
            collector.record_to(None)


def _collect(collector: TrajectoryCollector, max_turn: int, seed: int | None, batches: int,
             progress: bool, err_console: Console, results: list[RolloutBatch],
             out: _WholeBatches | None) -> None:
    """Collect ``batches`` batches into ``results`` (each written to ``out`` as it completes);
    the progress bar advances per turn over every batch."""
    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                   TextColumn("{task.completed}/{task.total} turns"),
                   TextColumn("{task.fields[active]} envs running"), TimeElapsedColumn(),
                   console=err_console, disable=not progress, transient=True)
    ticker = _Ticker(batches, max_turn) if progress and not err_console.is_terminal else None
    with bar:
        task = bar.add_task(f"batch 1/{batches}", total=batches * max_turn,
                            active=collector.pool.num_envs)

        def on_turn(_gen_batch: int, turn: int, active: int) -> None:
            b = len(results)  # the batch being collected
            completed, description = progress_position(b, turn, batches, max_turn)
            bar.update(task, completed=completed, active=active, description=description)
            if ticker is not None:
                ticker.state = (b, turn, active)

        collector.on_turn = on_turn
        if ticker is not None:
            ticker.start()
        try:
            _collect_batches(collector, seed, batches, results, out,
                             lambda b: bar.update(task, completed=(b + 1) * max_turn))
        finally:
            if ticker is not None:
                ticker.stop()


def progress_position(batch: int, turn: int, batches: int, max_turn: int) -> tuple[int, str]:
    """The bar's position (turns done over the whole run) and label once ``turn`` of
    ``batch`` (both from 0) has finished.

        >>> progress_position(1, 2, 3, 5)
        (8, 'batch 2/3')
    """
    return batch * max_turn + min(turn + 1, max_turn), f"batch {batch + 1}/{batches}"


def _collect_batches(collector: TrajectoryCollector, seed: int | None, batches: int,
                     results: list[RolloutBatch], out: _WholeBatches | None,
                     finished: Callable[[int], None]) -> None:
    for b in range(batches):
        try:
            # gen_batch counts on over the run: no two batches share a group_uid
            batch = collector.collect(seed if b == 0 else None,
                                      first_gen_batch=collector.gen_batches)
        except BudgetExhausted as exc:
            raise RolloutFailed(str(exc)) from exc
        if out is not None:
            out.add(batch.trajectories)
        results.append(batch)
        finished(b)  # the bar is full at a batch's end, even when its envs ended early


class _Ticker:
    """Without a terminal, one progress line on stderr every `PROGRESS_EVERY_S` seconds, so
    a long rollout in a log or CI shows it is alive."""

    def __init__(self, batches: int, max_turn: int) -> None:
        self.batches, self.max_turn = batches, max_turn
        self.state = (0, -1, 0)  # batch, last finished turn, envs running
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="turnpool-progress",
                                        daemon=True)
        self._started = time.monotonic()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(PROGRESS_EVERY_S):
            b, turn, active = self.state
            print(f"rollout: batch {b + 1}/{self.batches}, {turn + 1}/{self.max_turn} turns "
                  f"done, {active} envs running, {time.monotonic() - self._started:.0f} s",
                  file=sys.stderr, flush=True)


def check_out_path(out_path: str | None) -> None:
    """Refuse an ``--out`` whose extension names a format turnpool does not write, and a
    ``.parquet`` without pyarrow, before any env starts."""
    if not out_path:
        return
    suffix = Path(out_path).suffix.lower()
    if suffix not in OUT_FORMATS:
        raise UserError(f"--out {out_path}: write .jsonl or .parquet (got "
                        f"{suffix or 'no extension'})", EXIT_USAGE)
    if suffix == ".parquet":
        from turnpool.extras import require

        require("pyarrow", feature="turnpool rollout --out *.parquet", extra="data")


def write_parquet(trajectories: list[Any], path: Path) -> None:
    """The trajectories as a parquet table: one row per trajectory, the JSONL line's fields
    as columns (nested values as JSON text, so every row has one schema)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from turnpool.rollout.trajectory import dumps

    rows = [{k: v if isinstance(v, (str, int, float, bool)) or v is None
             else json.dumps(v, sort_keys=True)
             for k, v in json.loads(dumps(t)).items()} for t in trajectories]
    pq.write_table(pa.Table.from_pylist(rows), path)


def summary_table(metrics: dict[str, float], tags: list[str], group_size: int,
                  batches: int = 1) -> Table:
    """Per-tag outcome table (valid: accepted actions; penalty: penalized turns) over the
    whole run (``batches`` batches)."""
    headers = ["tag", "n", "success", f"pass@{group_size}", "valid", "penalty", "actions",
               "score", "errors"]
    rows = []
    for tag in dict.fromkeys(tags):
        def g(key: str, tag: str = tag) -> float:
            return metrics.get(f"{tag}/{key}", 0.0)
        rows.append([tag, f"{g('trajectories'):.0f}", f"{g('success'):.3f}",
                     f"{g(f'pass@{group_size}'):.3f}", f"{g('valid_action_ratio'):.3f}",
                     f"{g('penalty_rate'):.3f}", f"{g('num_actions'):.2f}",
                     f"{g('score'):.3f}", f"{g('errors'):.0f}"])
    table = make_table(f"rollout, {batches} batch{'es' if batches > 1 else ''}", headers, rows,
                       right=headers[1:])
    table.caption = "valid: accepted actions; penalty: penalized turns"
    return table


def batches_table(results: list[RolloutBatch], tags: list[str]) -> Table:
    """One row per batch: its trajectories, and each tag's success."""
    tags = list(dict.fromkeys(tags))
    rows = [[str(i + 1), str(len(b.trajectories)),
             *(f"{b.metrics.get(f'{tag}/success', 0.0):.3f}" for tag in tags),
             f"{b.metrics.get('env_steps', 0.0):.0f}"] for i, b in enumerate(results)]
    headers = ["batch", "n", *(f"{tag} success" for tag in tags), "env steps"]
    return make_table("per batch", headers, rows, right=headers)


def timing_table(metrics: dict[str, float], backend: str, workers: int, wall: float) -> Table:
    """Where the time went: env (pool) vs policy, per turn and per env step."""
    env_s, pol_s = metrics.get("timing/env_s", 0.0), metrics.get("timing/policy_s", 0.0)
    total = env_s + pol_s
    rows = [
        ("backend", f"{backend} ({workers} worker{'s' if workers != 1 else ''})"),
        ("env steps", f"{metrics.get('env_steps', 0.0):.0f}"),
        ("env-steps/s", f"{metrics.get('env_steps_per_s', 0.0):,.0f}"),
        ("env time (step)", f"{env_s:.3f} s ({100 * env_s / total if total else 0:.1f}%)"),
        ("policy time", f"{pol_s:.3f} s ({100 * pol_s / total if total else 0:.1f}%)"),
        ("env time per turn", f"{metrics.get('timing/env_ms_per_turn', 0.0):.2f} ms"),
        ("policy time per turn", f"{metrics.get('timing/policy_ms_per_turn', 0.0):.2f} ms"),
        ("prompts + parsing per turn",
         f"{metrics.get('timing/manager_ms_per_turn', 0.0):.2f} ms"),
        ("reset time", f"{metrics.get('timing/reset_s', 0.0):.3f} s"),
        ("turns", f"{metrics.get('timing/turns', 0.0):.0f}"),
        ("wall (incl. start-up)", f"{wall:.2f} s"),
    ]
    for key in ("gen_batches", "kept_groups", "dropped_groups", "surplus_groups",
                "filled_groups"):
        if f"dynamic/{key}" in metrics:
            rows.append((f"dynamic: {key.replace('_', ' ')}",
                         f"{metrics[f'dynamic/{key}']:.0f}"))
    if "tree/forks" in metrics:
        rows.append(("tree: nodes / forks", f"{metrics['tree/nodes']:.0f} / "
                                            f"{metrics['tree/forks']:.0f}"))
        rows.append(("tree: fork time", f"{metrics['tree/fork_s']:.3f} s"))
        if "tree/chosen_success" in metrics:
            rows.append(("tree: chosen paths' success",
                         f"{metrics['tree/chosen_success']:.3f}"))
    return make_table("time", ["quantity", "value"], rows, right=["value"])
