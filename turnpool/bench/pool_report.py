"""What `turnpool bench pool` reports from its rows: the derived numbers and the issues'
goals (`summarize`), the tables and notes it prints (`render`) and its plot (`plot`). The
module docstring of `turnpool.bench.pool` explains the benchmark."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from turnpool.bench.harness import speed_text
from turnpool.bench.pool_measure import ALL_ENVS, BENCH_BACKENDS, FLOOR, GYM, RAY2, THREAD16
from turnpool.cli.layout import make_table


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


__all__ = ["first_steps_speedup", "plot", "render", "summarize"]
