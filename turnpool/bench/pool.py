"""``turnpool bench pool``: every pool backend side by side, measured in one run.

The table answers one question per env kind, each against the in-process loop:

* ``trivial`` (about 1 µs per step): what the backend itself costs, in µs per env-step;
* ``cpu`` (pure-Python work, calibrated here to about 1 ms per step): speedup over
  sequential, bounded by the number of cores;
* ``sleep`` (a 1 ms blocking wait, like a web call): speedup over sequential, bounded by
  concurrency, not cores;
* ``sokoban`` (when that env is installed): wall time of one turn of the whole batch.

gymnasium's ``AsyncVectorEnv`` (one process per env, ``shared_memory=False`` because its
shared-memory path returns stale text observations) runs the same envs through an adapter as
the external reference column. The ``bare_pipes`` row (trivial and cpu envs) is the floor
under any process pool here: the process backend's envs, workers and pickled pipes with none
of the pool's safety (`turnpool.bench.pool_floor`); a goal below it cannot be reached by
trimming the pool. Ray is measured last so that no process is forked after Ray's
threads exist.

Every row records the CPU its own process tree spent per pool step (``cpu_s``; printed as µs
per env-step for the trivial rows, the steadier number on a shared machine) and how much CPU
other processes used while it was timed (``other_load``); a row disturbed beyond
``--max-other-load`` is measured again (``--retries``) and the least disturbed attempt is
kept, and ``--wait-quiet`` waits for a quiet machine before each row. The report also records
the machine's pure-Python speed before and after the run (`turnpool.bench.harness
.python_speed`): the absolute µs move with it, the side-by-side ratios do not.

The default run is the quick one (under a minute): every backend but Ray at N = 8 (the
AsyncVectorEnv column on the trivial and cpu envs only), each timed right after its pool has
started (one warm-up step), which is what a short rollout sees; the first 10 steps after each
pool's start are also timed on their own (``first_s``; the cpu env's speedup in them is
reported, since a worker still starting up would show there); ``--backends ray`` adds Ray.
``--full`` runs the whole grid (N = 8, 64, 256, longer blocks, retries; several minutes).

    turnpool bench pool                                    # quick, <= 60 s
    turnpool bench pool --full --json pool.json --plot pool.png
    turnpool bench pool --full --retries 3 --wait-quiet 10    # on a shared machine
    turnpool bench pool --backends sequential,process --envs cpu
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click

from turnpool.bench.harness import (
    json_option,
    machine_info,
    measure_and_print,
    plot_option,
    python_speed,
    start,
    write_outputs,
)
from turnpool.bench.pool_measure import (
    ALL_ENVS,
    BENCH_BACKENDS,
    FLOOR,
    GYM,
    RAY2,
    THREAD16,
    EnvCase,
    OtherLoad,
    Row,
    Settings,
    env_cases,
    measure_floor,
    measure_gym,
    measure_pool,
    measure_sokoban_turn,
)
from turnpool.bench.pool_report import plot, render, summarize

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------ orchestration
@dataclass
class Step:
    """One planned row: ``label`` names it in the table, ``backend`` is what runs."""

    case: EnvCase
    label: str
    backend: str
    n: int
    workers: int | None = None


def _plan(settings: Settings, cases: Sequence[EnvCase]) -> list[Step]:
    """Rows in run order: everything else first, Ray last (see module doc)."""
    plan: list[Step] = []
    for ray_pass in (False, True):
        for case in cases:
            for n in settings.sizes:
                for backend in settings.backends:
                    if (backend == "ray") == ray_pass:
                        plan.append(Step(case, backend, backend, n))
                if ray_pass:
                    continue
                if (settings.gym and n <= settings.gym_max_n
                        and (settings.gym_envs is None or case.name in settings.gym_envs)):
                    plan.append(Step(case, GYM, GYM, n))
                if case.name in settings.floor_envs:
                    plan.append(Step(case, FLOOR, FLOOR, n))
                if settings.thread16 and case.name == "sleep":
                    plan.append(Step(case, THREAD16, "thread", n, 16))
        if (ray_pass and not settings.quick and "ray" in settings.backends
                and any(c.name == "trivial" for c in cases)):
            trivial = next(c for c in cases if c.name == "trivial")
            plan.append(Step(trivial, RAY2, "ray", 64, 2))
    return plan


def run_benchmark(settings: Settings, progress: Callable[..., None] | None = None) -> dict:
    """Run every configuration and return the report (what ``--json`` writes)."""
    started = time.time()
    speed_before = python_speed()
    cases = env_cases(settings)
    rows: list[Row] = []
    ray_started_here = False
    if settings.gym and importlib.util.find_spec("gymnasium") is None:
        log.warning("gymnasium is not installed; no AsyncVectorEnv reference column")
        settings.gym = False
    plan = _plan(settings, cases)
    for k, step in enumerate(plan):
        text = f"{step.case.name} {step.label} N={step.n}"
        if progress:
            progress(text, k, len(plan))
        if step.backend == "ray" and not ray_started_here:
            ray_started_here = _ray_was_down()
        rows.append(_measure_step(step, settings, text))
    sokoban_turn = measure_sokoban_turn(settings) if settings.sokoban_turn else None
    if ray_started_here:
        _ray_shutdown()
    report = {
        "machine": machine_info(processor=platform.processor(),
                                python_ns_per_iter=[speed_before, python_speed()]),
        "settings": asdict(settings),
        "env_kwargs": {c.name: c.kwargs for c in cases},
        "rows": [{**asdict(r), "us_per_env_step": r.us_per_env_step,
                  "cpu_us_per_env_step": r.cpu_us_per_env_step} for r in rows],
        "sokoban_128": sokoban_turn,
        "elapsed_s": time.time() - started,
    }
    report["summary"] = summarize(report)
    return report


def _measure_step(step: Step, settings: Settings, text: str) -> Row:
    """One row, re-measured while other processes disturbed it; the cleanest attempt wins."""
    best: Row | None = None
    for _attempt in range(1 + max(0, settings.retries)):
        OtherLoad().wait_quiet(settings.max_other_load, settings.wait_quiet_s)
        try:
            if step.backend == GYM:
                row = measure_gym(step.case, step.n, settings)
            elif step.backend == FLOOR:
                row = measure_floor(step.case, step.n, settings)
            else:
                row = measure_pool(step.case, step.backend, step.n, settings, step.workers)
            row.backend = step.label
        except Exception as exc:  # one broken backend must not lose the whole table
            log.exception("%s failed", text)
            return Row(step.case.name, step.label, step.n, float("nan"), float("nan"), 0,
                       step.workers, error=f"{type(exc).__name__}: {exc}")
        if best is None or (row.other_load or 0.0) < (best.other_load or 0.0):
            best = row
        if (best.other_load or 0.0) <= settings.max_other_load:
            break
    assert best is not None
    return best


def _ray_was_down() -> bool:
    try:
        import ray
    except ImportError:
        return False
    return not ray.is_initialized()


def _ray_shutdown() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()


# -------------------------------------------------------------------------------- CLI
def _csv(kind: type, choices: Sequence[Any] | None = None) -> Callable[..., Any]:
    def parse(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        if value is None:
            return None
        items = tuple(kind(v.strip()) for v in value.split(",") if v.strip())
        if choices is not None:
            bad = [v for v in items if v not in choices]
            if bad:
                raise click.BadParameter(f"{bad} not in {list(choices)}")
        return items
    return parse


@click.command(name="pool")
@json_option("Write the full report (rows, summary, goals) as JSON.")
@plot_option("Save a PNG of throughput vs N per backend.")
@click.option("--quick", "mode", flag_value="quick", default=True,
              help="N=8 only, timed right after pool start (the default; <= 60 s).")
@click.option("--full", "mode", flag_value="full",
              help="The whole grid: N=8,64,256, longer blocks, retries (minutes).")
@click.option("--backends", callback=_csv(str, BENCH_BACKENDS),
              help=f"Comma list (default all: {','.join(BENCH_BACKENDS)}).")
@click.option("--envs", callback=_csv(str, ALL_ENVS),
              help=f"Comma list (default all: {','.join(ALL_ENVS)}).")
@click.option("--sizes", callback=_csv(int), help="Comma list of N (default 8,64,256).")
@click.option("--workers", type=int, default=None,
              help="num_workers for every backend (default: each backend's own).")
@click.option("--mp-context", type=click.Choice(["spawn", "forkserver", "fork"]),
              default=None, help="Start method for process backends (default: the pool's).")
@click.option("--min-time", type=float, default=None,
              help="Seconds of stepping per timed block (default 0.1; full 0.3).")
@click.option("--repeats", type=int, default=None, help="Timed blocks per row (median).")
@click.option("--retries", type=int, default=None,
              help="Re-measure a row this often while other processes disturb it "
                   "(default 0; full 1).")
@click.option("--max-other-load", type=float, default=0.15, show_default=True,
              help="Share of the machine other processes may use during a clean row.")
@click.option("--wait-quiet", type=float, default=0.0, show_default=True,
              help="Seconds to wait, before each row, for the machine to be that quiet.")
@click.option("--no-gym", is_flag=True, help="Skip the gymnasium AsyncVectorEnv column.")
@click.option("--no-floor", is_flag=True,
              help="Skip the bare-pipes floor row (trivial and cpu envs).")
@click.option("--gym-max-n", type=int, default=256,
              help="Largest N for AsyncVectorEnv (it starts one process per env).")
def command(json_path: Path | None, plot_path: Path | None, mode: str,
            backends: tuple[str, ...] | None, envs: tuple[str, ...] | None,
            sizes: tuple[int, ...] | None, workers: int | None, mp_context: str | None,
            min_time: float | None, repeats: int | None, retries: int | None,
            max_other_load: float, wait_quiet: float, no_gym: bool, no_floor: bool,
            gym_max_n: int) -> None:
    """Every pool backend on trivial / cpu / sleep / sokoban envs (quick: N=8).

    \b
    Examples:
      turnpool bench pool
      turnpool bench pool --full --json pool.json --plot pool.png
      turnpool bench pool --backends sequential,process --envs cpu
    """
    quick = mode == "quick"
    console = start()
    settings = Settings(workers=workers, mp_context=mp_context, gym=not no_gym,
                        gym_max_n=gym_max_n, quick=quick, max_other_load=max_other_load,
                        wait_quiet_s=wait_quiet)
    if no_floor:
        settings.floor_envs = ()
    if quick:
        settings.sizes, settings.min_time_s, settings.repeats, settings.warmup = (8,), 0.1, 3, 1
        settings.thread16, settings.retries, settings.sokoban_turn = False, 0, False
    settings.retries = retries if retries is not None else settings.retries
    if quick and not backends:  # Ray's start-up alone is a large part of a minute
        settings.backends = tuple(b for b in BENCH_BACKENDS if b != "ray")
    if quick and not envs:  # one AsyncVectorEnv process per env: keep two of its columns
        settings.gym_envs = ("trivial", "cpu")
    settings.backends = backends or settings.backends
    settings.envs = envs or settings.envs
    settings.sizes = sizes or settings.sizes
    settings.min_time_s = min_time if min_time is not None else settings.min_time_s
    settings.repeats = repeats if repeats is not None else settings.repeats

    report = measure_and_print(console, lambda progress: run_benchmark(settings, progress),
                               render)
    console.print(f"elapsed {report['elapsed_s']:.0f} s")
    write_outputs(console, report, json_path, plot_path, plot)


__all__ = ["Row", "Settings", "command", "run_benchmark", "summarize"]
