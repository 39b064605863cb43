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
import statistics
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
    speed_text,
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
from turnpool.cli.layout import make_table

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


# ----------------------------------------------------------------------------- summary
def _index(report: dict) -> dict[tuple[str, str, int], dict]:
    return {(r["env"], r["backend"], r["n"]): r for r in report["rows"] if not r["error"]}


def summarize(report: dict) -> dict[str, Any]:
    """Derived numbers: speedups, auto's ratio to the best backend, and the issue's goals."""
    idx = _index(report)
    sizes = report["settings"]["sizes"]
    envs = sorted({r["env"] for r in report["rows"]})
    speedup: dict[str, dict[str, dict[int, float]]] = {}
    for (env, backend, n), row in idx.items():
        seq = idx.get((env, "sequential", n))
        if seq:
            speedup.setdefault(env, {}).setdefault(backend, {})[n] = (
                seq["batch_s"] / row["batch_s"])
    auto_ratio: dict[str, dict[int, float]] = {}
    for env in envs:
        for n in sizes:
            auto = idx.get((env, "auto", n))
            others = [r["batch_s"] for (e, b, m), r in idx.items()
                      if e == env and m == n and b not in ("auto", GYM, THREAD16, RAY2, FLOOR)]
            if auto and others:
                auto_ratio.setdefault(env, {})[n] = auto["batch_s"] / min(others)

    def us(backend: str, n: int, env: str = "trivial") -> float | None:
        row = idx.get((env, backend, n))
        return row["us_per_env_step"] if row else None

    goals: list[dict[str, Any]] = []

    def goal(name: str, target: str, value: float | None, ok: bool | None) -> None:
        goals.append({"goal": name, "target": target, "measured": value, "met": ok})

    for n, limit in zip((8, 64, 256), (7.0, 2.0, 1.2)):
        v = us("process", n)
        goal(f"process trivial overhead N={n}", f"<= {limit} us/env-step", v,
             None if v is None else v <= limit)
    for n in (8, 64, 256):
        v = speedup.get("cpu", {}).get("process", {}).get(n)
        goal(f"process cpu speedup N={n}", ">= 1.90x", v, None if v is None else v >= 1.90)
    v = first_steps_speedup(idx, "process", 8)
    goal("process cpu speedup N=8, first steps after start", ">= 1.80x", v,
         None if v is None else v >= 1.80)
    p64, g64 = us("process", 64), us(GYM, 64)
    ratio = g64 / p64 if p64 and g64 else None
    goal("AsyncVectorEnv / process overhead N=64", ">= 10x", ratio,
         None if ratio is None else ratio >= 10)
    t16 = speedup.get("sleep", {}).get(THREAD16, {})
    best16 = max(t16.values()) if t16 else None
    goal("thread (16 threads) sleep speedup, best N", ">= 12x", best16,
         None if best16 is None else best16 >= 12)
    worst_auto = max((v for d in auto_ratio.values() for v in d.values()), default=None)
    goal("auto / best backend, worst env and N", "<= 1.2x", worst_auto,
         None if worst_auto is None else worst_auto <= 1.2)
    ray64 = idx.get(("trivial", RAY2, 64))
    ray_ms = ray64["batch_s"] * 1e3 if ray64 else None
    goal("ray: one turn of 64 trivial envs on 2 actors", "<= 2 ms", ray_ms,
         None if ray_ms is None else ray_ms <= 2.0)
    sk = report.get("sokoban_128")
    if sk:
        goal("128 sokoban envs reset (in-process)", "<= 15 ms", sk["reset_ms"],
             sk["reset_ms"] <= 15)
        goal("128 sokoban envs one turn (in-process)", "<= 5 ms", sk["turn_ms"],
             sk["turn_ms"] <= 5)
    floor = {n: (us("process", n), us(FLOOR, n)) for n in sizes
             if us("process", n) is not None and us(FLOOR, n) is not None}
    return {"speedup": speedup, "auto_ratio": auto_ratio, "goals": goals, "floor": floor}


def first_steps_speedup(idx: dict, backend: str, n: int) -> float | None:
    """The cpu env's speedup over sequential in the first steps after each pool's start."""
    row, seq = idx.get(("cpu", backend, n)), idx.get(("cpu", "sequential", n))
    if not row or not seq or not row.get("first_s") or not seq.get("first_s"):
        return None
    return float(seq["first_s"] / row["first_s"])


# ---------------------------------------------------------------------------- output
_TITLES = {
    "trivial": "trivial env: µs per env-step (the backend's own overhead; lower is better)",
    "cpu": "cpu env (~1 ms of Python per step): speedup over sequential (limit: cores)",
    "sleep": "sleep env (1 ms wait per step): speedup over sequential (limit: concurrency)",
    "sokoban": "sokoban (6x6, 1 box): ms per turn of the whole batch",
}
_LABELS = {THREAD16: "thread, 16 threads", RAY2: "ray, 2 actors",
           GYM: "gymnasium AsyncVectorEnv", FLOOR: "bare pipes (floor: no safety)"}


def _cell(report: dict, idx: dict, env: str, backend: str, n: int) -> str:
    row = idx.get((env, backend, n))
    if row is None:
        failed = [r for r in report["rows"] if (r["env"], r["backend"], r["n"]) ==
                  (env, backend, n)]
        return "error" if failed else "-"
    if env == "trivial":
        return f"{row['us_per_env_step']:.1f}"
    if env == "sokoban":
        return f"{row['batch_s'] * 1e3:.2f}"
    seq = idx.get((env, "sequential", n))
    return f"{seq['batch_s'] / row['batch_s']:.2f}x" if seq else "-"


def render(report: dict) -> list[Any]:
    """Rich renderables: one table per env (backends x N), the goals table and notes."""
    from rich.table import Table

    idx = _index(report)
    sizes = report["settings"]["sizes"]
    out: list[Any] = []
    for env in ALL_ENVS:
        rows = [r for r in report["rows"] if r["env"] == env]
        if not rows:
            continue
        table = Table(title=_TITLES[env], title_justify="left")
        table.add_column("backend")
        table.add_column("workers", justify="right")
        for n in sizes:
            table.add_column(f"N={n}", justify="right")
        for backend in (*BENCH_BACKENDS, THREAD16, RAY2, FLOOR, GYM):
            mine = [r for r in rows if r["backend"] == backend]
            if not mine or all(r["n"] not in sizes for r in mine):
                continue
            label = _LABELS.get(backend, backend)
            active = sorted({r["active_backend"].removeprefix("auto->") for r in mine
                             if r["active_backend"].startswith("auto->")})
            if active:
                label += " -> " + "/".join(active)
            workers = sorted({r["workers"] for r in mine if r["workers"] is not None})
            table.add_row(label, ",".join(map(str, workers)) or "-",
                          *(_cell(report, idx, env, backend, n) for n in sizes))
        out.append(table)

    measured = [g for g in report["summary"]["goals"] if g["measured"] is not None]
    out.append(make_table(
        "goals (measured on a shared machine: noisy)", ["goal", "target", "measured", "met"],
        [[g["goal"], g["target"], f"{g['measured']:.2f}", "yes" if g["met"] else "no"]
         for g in measured], right=["measured"]))
    first = {b: first_steps_speedup(idx, b, sizes[0]) for b in (*BENCH_BACKENDS, FLOOR)
             if b != "sequential"}
    if any(v is not None for v in first.values()):
        out.append(f"cpu env, first {report['settings']['first_steps']} steps after start, "
                   f"N={sizes[0]}: speedup " + ", ".join(f"{b} {v:.2f}x"
                                                        for b, v in first.items() if v))
    floor = report["summary"].get("floor") or {}
    if floor:
        out.append("trivial env, process backend / its floor (the same envs, workers and "
                   "pickled pipes with none of the pool's safety), µs per env-step: " +
                   "; ".join(f"N={n} {p:.2f} / {f:.2f} ({p / f:.2f}x)"
                             for n, (p, f) in floor.items()))
    cpu = [(r["backend"], r["n"], r.get("cpu_us_per_env_step")) for r in report["rows"]
           if r["env"] == "trivial" and r.get("cpu_us_per_env_step") is not None]
    if cpu:
        out.append("trivial env, CPU of the caller and its workers per env-step (µs; steadier "
                   "than wall time when others load the machine): " + "; ".join(
                       f"{b} N={n} {v:.2f}" for b, n, v in cpu))
    speed = speed_text(report["machine"])
    if speed:
        out.append(speed)
    ratio = report["summary"]["auto_ratio"]
    if ratio:
        out.append("auto / best backend: " + "; ".join(
            f"{env} " + " ".join(f"N={n}:{v:.2f}" for n, v in sorted(d.items()))
            for env, d in ratio.items()))
    loads = [r["other_load"] for r in report["rows"] if r["other_load"] is not None]
    if loads:
        dirty = sum(v > report["settings"]["max_other_load"] for v in loads)
        out.append(f"CPU used by other processes while timing: median "
                   f"{statistics.median(loads):.0%}, max {max(loads):.0%} of the machine; "
                   f"{dirty} of {len(loads)} rows above "
                   f"{report['settings']['max_other_load']:.0%} (see other_load in the JSON)")
    gym_n = report["settings"]["gym_max_n"]
    if report["settings"]["gym"] and any(n > gym_n for n in sizes):
        out.append(f"AsyncVectorEnv skipped above N={gym_n} (one process per env).")
    for r in report["rows"]:
        if r["error"]:
            out.append(f"[red]{r['env']} {r['backend']} N={r['n']}: {r['error']}[/red]")
    return out


def plot(report: dict, path: Path) -> None:
    """Throughput (env-steps/s) vs N, one line per backend, one panel per env."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = [e for e in ALL_ENVS if any(r["env"] == e for r in report["rows"])] or ["trivial"]
    cols = 2 if len(envs) > 1 else 1
    rows = (len(envs) + cols - 1) // cols
    fig, grid = plt.subplots(rows, cols, figsize=(6.0 * cols, 4.4 * rows), squeeze=False)
    axes = [ax for line in grid for ax in line]
    for ax in axes[len(envs):]:
        ax.set_visible(False)
    for ax, env in zip(axes, envs):
        by_backend: dict[str, list[tuple[int, float]]] = {}
        for r in report["rows"]:
            if r["env"] == env and not r["error"]:
                by_backend.setdefault(r["backend"], []).append(
                    (r["n"], r["n"] / r["batch_s"]))
        for backend, points in sorted(by_backend.items()):
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                    label=backend, linestyle="--" if backend == GYM else "-")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(env)
        ax.set_xlabel("envs (N)")
        ax.set_ylabel("env-steps / s")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle(f"turnpool bench pool ({report['machine']['cpu_count']} cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
