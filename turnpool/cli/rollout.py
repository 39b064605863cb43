"""``turnpool rollout``: collect one batch from a config and print where the time went.

    turnpool rollout                                   # Sokoban 8 groups x 16, oracle policy
    turnpool rollout --config configs/frozen_lake.yaml agent_proxy.max_turn=8 \\
        --json summary.json --out trajectories.jsonl
    turnpool rollout --backend process --workers 4 --policy random --seed 7
    turnpool rollout turnpool.collector.tree.mode=best_of_n --out t.jsonl --tree-out tree.jsonl
    turnpool rollout turnpool.collector.mode=async --record run.jsonl.gz   # then:
    turnpool replay run.jsonl.gz

``--backend``, ``--workers`` and ``--policy`` are shorthands for the dotlist keys
``turnpool.backend``, ``turnpool.num_workers`` and ``turnpool.policy.name``.

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
(Ctrl-C: the pool is closed at once and the JSONL holds the batches finished so far, one
complete trajectory per line).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from turnpool.backends import BACKENDS
from turnpool.cli.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_POLICY_UNREACHABLE,
    EXIT_TOO_MANY_FAILURES,
    EXIT_USAGE,
    UserError,
    missing_extra,
    unknown_env,
)
from turnpool.cli.layout import fit, make_table
from turnpool.policies import policy_names
from turnpool.policies.base import PolicyUnreachable
from turnpool.pool.api import EnvConstructionError
from turnpool.ragen.config import ConfigError, load_config, rollout_plan
from turnpool.rollout.collector import RolloutBatch, TrajectoryCollector
from turnpool.rollout.record import Recorder
from turnpool.rollout.sampling import BudgetExhausted
from turnpool.rollout.settings import RolloutPlan
from turnpool.rollout.trajectory import write_jsonl
from turnpool.worker.protocol import FAILURE_CLASSES

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
  turnpool rollout --policy random es_manager.train.env_groups=4
  turnpool rollout --config configs/multi.yaml --json s.json --out t.jsonl
"""


@click.command(epilog=_EPILOG)
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="YAML config (RAGEN keys + turnpool keys); default: the packaged one.")
@click.argument("overrides", nargs=-1)
@click.option("--backend", type=click.Choice(list(BACKENDS)), default=None,
              help="Shorthand for turnpool.backend=...")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Shorthand for turnpool.num_workers=...")
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
            tree_path: str | None = None, record_path: str | None = None) -> None:
    """Collect one batch of trajectories and print a summary.

    OVERRIDES are dotted key=value pairs, e.g. es_manager.train.env_groups=4
    turnpool.policy.name=random turnpool.backend=process.
    """
    overrides = overrides + sugar_overrides(backend, workers, policy)
    check_out_path(out_path)
    try:
        cfg = load_config(config_path, overrides)
        _check_env_types(cfg, mode)
        plan = rollout_plan(cfg, mode)
        _check_policy(plan.policy)
    except ConfigError as exc:
        raise UserError(str(exc), EXIT_USAGE) from exc
    console = Console()
    err_console = Console(stderr=True)
    t0 = time.perf_counter()
    collector = _build(plan)
    parquet = bool(out_path) and Path(str(out_path)).suffix.lower() == ".parquet"
    out_file = (open(out_path, "w", encoding="utf-8")  # noqa: SIM115
                if out_path and not parquet else None)
    results: list[RolloutBatch] = []
    try:
        with collector, _recording(collector, record_path) as recorder:
            batch = _collect(collector, plan.collector.max_turn, seed, batches, progress,
                             err_console, results, out_file)
            backend, workers = collector.pool.backend_name, collector.pool.num_workers
    except KeyboardInterrupt:
        lines = sum(len(b.trajectories) for b in results)
        where = f"; {lines} trajectories in {out_path}" if out_path else ""
        raise RolloutFailed(f"interrupted after {len(results)} batch(es){where}",
                            EXIT_INTERRUPTED) from None
    except PolicyUnreachable as exc:
        raise RolloutFailed(str(exc), EXIT_POLICY_UNREACHABLE) from exc
    finally:
        if out_file is not None:
            out_file.close()
    if parquet and out_path:
        write_parquet([t for b in results for t in b.trajectories], Path(out_path))
    if tree_path:
        with open(tree_path, "w", encoding="utf-8") as fh:
            nodes = sum(b.write_tree(fh) for b in results)
    wall = time.perf_counter() - t0
    summary = {
        "mode": mode, "backend": backend, "num_workers": workers,
        "policy": plan.policy.get("name"), "group_size": plan.group_size,
        "num_groups": plan.num_groups, "max_turn": plan.collector.max_turn,
        "tags": [t.tag for t in plan.tags], "wall_s": wall,
        "metrics": batch.metrics, "trajectories_out": out_path,
    }
    console.print(fit(console, summary_table(batch.metrics, [t.tag for t in plan.tags],
                                             plan.group_size)))
    console.print(fit(console, timing_table(batch.metrics, backend, workers, wall)))
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
    _check_failures(batch.metrics, max_failed_fraction, batch.first_error)


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
             out_file: IO[str] | None) -> RolloutBatch:
    """Collect ``batches`` batches (appending each to ``out_file`` as it completes); the last
    batch, with metrics summed over all of them where a sum means something."""
    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                   TextColumn("{task.completed}/{task.total} turns"),
                   TextColumn("{task.fields[active]} envs running"), TimeElapsedColumn(),
                   console=err_console, disable=not progress, transient=True)
    ticker = _Ticker(batches, max_turn) if progress and not err_console.is_terminal else None
    with bar:
        task = bar.add_task("rollout", total=max_turn, active=collector.pool.num_envs)

        def on_turn(gen_batch: int, turn: int, active: int) -> None:
            if turn == 0 and gen_batch > 0:
                bar.reset(task, total=max_turn)
            bar.update(task, completed=turn + 1, active=active,
                       description=f"batch {gen_batch + 1}")
            if ticker is not None:
                ticker.state = (gen_batch, turn, active)

        collector.on_turn = on_turn
        if ticker is not None:
            ticker.start()
        try:
            _collect_batches(collector, seed, batches, results, out_file)
        finally:
            if ticker is not None:
                ticker.stop()
    batch = results[-1]
    if len(results) > 1:  # failure counts add up over batches
        for key in [k for k in batch.metrics if k.startswith("failures/")]:
            batch.metrics[key] = sum(r.metrics.get(key, 0.0) for r in results)
        batch.metrics["failures/unrecovered_fraction"] = (
            batch.metrics["failures/unrecovered"] / max(1.0, batch.metrics["failures/started"]))
    return batch


def _collect_batches(collector: TrajectoryCollector, seed: int | None, batches: int,
                     results: list[RolloutBatch], out_file: IO[str] | None) -> None:
    for b in range(batches):
        try:
            batch = collector.collect(seed if b == 0 else None)
        except BudgetExhausted as exc:
            raise RolloutFailed(str(exc)) from exc
        if out_file is not None:
            write_jsonl(batch.trajectories, out_file)
            out_file.flush()
        results.append(batch)


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


def _check_env_types(cfg: Any, mode: str) -> None:
    """An unknown ``env_type`` of a tag the run uses is a usage error naming the tag."""
    custom = cfg.get("custom_envs") or {}
    section = (cfg.get("es_manager") or {}).get(mode) or {}
    tags = (section.get("env_configs") or {}).get("tags") or []
    for tag in dict.fromkeys(str(t) for t in tags):
        env_type = (custom.get(tag) or {}).get("env_type")
        if env_type is None:
            continue
        problem = unknown_env(str(env_type))
        if problem:
            raise UserError(f"custom_envs.{tag}.env_type: {problem}", EXIT_USAGE)


#: policy -> (the option it cannot do without, an example value)
REQUIRED_POLICY_OPTIONS = {"openai": ("base_url", "http://127.0.0.1:8000/v1"),
                           "hf": ("model_path", "path/to/model")}


def _check_policy(policy: dict[str, Any]) -> None:
    """A policy missing the option it cannot run without is one line saying which to set."""
    name = str(policy.get("name"))
    if name not in REQUIRED_POLICY_OPTIONS:
        return
    key, example = REQUIRED_POLICY_OPTIONS[name]
    section = policy.get(name) or {}
    if not policy.get(key) and not section.get(key):
        raise UserError(f"the {name} policy needs turnpool.policy.{name}.{key} (e.g. "
                        f"turnpool.policy.{name}.{key}={example})", EXIT_USAGE)


def sugar_overrides(backend: str | None, workers: int | None, policy: str | None
                    ) -> tuple[str, ...]:
    """The dotlist entries the shorthand options stand for (they win over earlier ones)."""
    out = []
    if backend is not None:
        out.append(f"turnpool.backend={backend}")
    if workers is not None:
        out.append(f"turnpool.num_workers={workers}")
    if policy is not None:
        out.append(f"turnpool.policy.name={policy}")
    return tuple(out)


def summary_table(metrics: dict[str, float], tags: list[str], group_size: int) -> Table:
    """Per-tag outcome table (valid: accepted actions; penalty: penalized turns)."""
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
    return make_table("rollout (valid: accepted actions; penalty: penalized turns)", headers,
                      rows, right=headers[1:])


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
