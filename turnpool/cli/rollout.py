"""``turnpool rollout``: collect one batch from a config and print where the time went.

    turnpool rollout                                   # Sokoban 8 groups x 16, oracle policy
    turnpool rollout --config configs/frozen_lake.yaml agent_proxy.max_turn=8 \\
        --json summary.json --out trajectories.jsonl
    turnpool rollout --backend process --workers 4 --policy random --seed 7

``--backend``, ``--workers`` and ``--policy`` are shorthands for the dotlist keys
``turnpool.backend``, ``turnpool.num_workers`` and ``turnpool.policy.name``.

The rollout summary (stdout) has one row per tag (success, pass@k, valid-action ratio, format
penalty rate, mean actions, errors) and the time split: env-steps/s, env time vs policy time,
env time per turn. The progress bar goes to stderr.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from turnpool.backends import BACKENDS
from turnpool.cli.layout import fit, make_table
from turnpool.policies import policy_names
from turnpool.ragen.config import ConfigError, load_config, rollout_plan
from turnpool.rollout.collector import BudgetExhausted, TrajectoryCollector

log = logging.getLogger(__name__)


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
              help="Write the trajectories as JSONL.")
@click.option("--mode", type=click.Choice(["train", "val"]), default="train", show_default=True,
              help="Which es_manager section to run.")
@click.option("--seed", type=int, default=None, help="Reset seed (default: seed.<mode>).")
@click.option("--progress/--no-progress", default=True, show_default=True)
def rollout(config_path: str | None, overrides: tuple[str, ...], backend: str | None,
            workers: int | None, policy: str | None, json_path: str | None,
            out_path: str | None, mode: str, seed: int | None, progress: bool) -> None:
    """Collect one batch of trajectories and print a summary.

    OVERRIDES are dotted key=value pairs, e.g. es_manager.train.env_groups=4
    turnpool.policy.name=random turnpool.backend=process.
    """
    overrides = overrides + sugar_overrides(backend, workers, policy)
    try:
        cfg = load_config(config_path, overrides)
        plan = rollout_plan(cfg, mode)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    console = Console()
    err_console = Console(stderr=True)
    t0 = time.perf_counter()
    try:
        collector = TrajectoryCollector.from_plan(plan)
    except (ValueError, TypeError) as exc:
        raise click.ClickException(str(exc)) from exc
    with collector:
        bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                       TextColumn("{task.completed}/{task.total} turns"),
                       TextColumn("{task.fields[active]} envs running"), TimeElapsedColumn(),
                       console=err_console, disable=not progress, transient=True)
        with bar:
            max_turn = plan.collector.max_turn
            task = bar.add_task("rollout", total=max_turn, active=collector.pool.num_envs)

            def on_turn(gen_batch: int, turn: int, active: int) -> None:
                if turn == 0 and gen_batch > 0:
                    bar.reset(task, total=max_turn)
                bar.update(task, completed=turn + 1, active=active,
                           description=f"batch {gen_batch + 1}")

            collector.on_turn = on_turn
            try:
                batch = collector.collect(seed)
            except BudgetExhausted as exc:
                raise click.ClickException(str(exc)) from exc
        backend, workers = collector.pool.backend_name, collector.pool.num_workers
    wall = time.perf_counter() - t0
    if out_path:
        batch.to_jsonl(out_path)
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
        console.print(f"wrote {len(batch.trajectories)} trajectories to {out_path}")


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
    return make_table("time", ["quantity", "value"], rows, right=["value"])
