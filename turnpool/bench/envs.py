"""``turnpool bench envs``: reset and step cost of every built-in env, measured in one run.

Two tables:

* every built-in text env (sokoban 6x6 with 1 and 3 boxes, frozen_lake, bandit, countdown,
  metamathqa): construction time, mean / p95 reset time over seeded resets, and mean step time
  over random actions (resets on episode end are not counted in the step figure);
* Sokoban room generation against gym_sokoban's ``generate_room`` (the external reference,
  installed with the ``bench`` extra) on the same rooms: 6x6, 1 and 3 boxes, walk length
  ``int(1.7 * (h + w))``, search depth 300. Time per usable room includes failed attempts on
  both sides. The two are timed in alternating blocks so that load from other processes hits
  both alike. gym_sokoban draws from the process-global RNG; it runs unseeded here, since only
  its timing matters.

A third table covers the RAGEN facade: how many rooms' first stages (topology, placement) are
gym_sokoban's own, fed the same local generators (the full rooms are checked seed by seed
against RAGEN's recorded rooms in the tests); the bytes a process worker sends per step for
1,024 VisualSimpleSokoban envs (the pickled step reply: frames never travel, the facade
draws them from the observation text) next to what pickled frames would cost; and the
facade's start (construction + first reset) with and without worker processes.

    turnpool bench envs --json envs.json
    turnpool bench envs --resets 50 --steps 500 --rooms 20     # quicker
"""

from __future__ import annotations

import importlib.util
import logging
import os
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import click
import numpy as np
from rich.markup import escape

from turnpool.bench.envs_facade import (
    measure_facade_start,
    measure_visual_transport,
    stage_identity,
)
from turnpool.bench.harness import (
    json_option,
    machine_info,
    measure_and_print,
    start,
    write_outputs,
)

log = logging.getLogger(__name__)

#: (env name, case label, make kwargs) in table order.
CASES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("sokoban", "6x6/1", {"dim_room": (6, 6), "num_boxes": 1}),
    ("sokoban", "6x6/3", {"dim_room": (6, 6), "num_boxes": 3}),
    ("frozen_lake", "4x4 slip", {}),
    ("bandit", "default", {}),
    ("countdown", "bundled", {}),
    ("metamathqa", "bundled", {}),
)
GEN_CASES: tuple[tuple[str, int], ...] = (("6x6/1", 1), ("6x6/3", 3))
SEARCH_DEPTH = 300
#: Free-text envs are stepped with this answer (a wrong but well-formed one).
TEXT_ACTION = "1 + 2"
#: RAGEN (Sept 2025 snapshot, gym_sokoban underneath) on the 2-core development machine:
#: measured separately, shown for context only.
RAGEN_REFERENCE_MS = {"reset 6x6/1": 1.17, "reset 6x6/3": 11.4, "step": 1.28}
GOAL_SPEEDUP = 5.0
GOAL_STEP_US = 30.0


@dataclass
class Settings:
    """How much to measure."""

    resets: int = 200
    steps: int = 2000
    rooms: int = 200
    block: int = 10


@dataclass
class EnvRow:
    """Reset and step cost of one env configuration."""

    env: str
    case: str
    kwargs: dict[str, Any]
    init_ms: float | None = None
    reset_ms_mean: float | None = None
    reset_ms_p95: float | None = None
    step_us_mean: float | None = None
    resets: int = 0
    steps: int = 0
    note: str = ""


@dataclass
class GenRow:
    """Seconds per usable room: ours vs gym_sokoban's ``generate_room``."""

    case: str
    num_boxes: int
    rooms: int
    ours_ms: float
    ours_failed_attempts: int
    gym_ms: float | None = None
    gym_failed_calls: int = 0
    speedup: float | None = None
    note: str = ""


# ------------------------------------------------------------------------------ envs
def _missing(name: str) -> str | None:
    """Why env ``name`` cannot be measured here, or None."""
    from turnpool.envs.registry import registered

    spec = registered().get(name)
    if spec is None:
        return "not registered"
    module = spec.entry_point.partition(":")[0]
    if importlib.util.find_spec(module) is None:
        return f"module {module} not found"
    return None


def _actions_for(env: Any) -> list[Any]:
    lookup = env.action_lookup_for_episode()
    return sorted(lookup) if lookup else [TEXT_ACTION]


def measure_env(name: str, case: str, kwargs: dict[str, Any], settings: Settings) -> EnvRow:
    """Construction, seeded resets 0..N-1, then random actions with resets off the clock.

    The env's module is imported before construction is timed.
    """
    from turnpool.envs.registry import make, resolve

    row = EnvRow(name, case, kwargs)
    why = _missing(name)
    if why:
        row.note = f"skipped: {why}"
        return row
    resolve(name)
    clock = time.perf_counter
    t0 = clock()
    env = make(name, **kwargs)
    row.init_ms = (clock() - t0) * 1e3
    try:
        resets = []
        for seed in range(settings.resets):
            t0 = clock()
            env.reset(seed=seed)
            resets.append(clock() - t0)
        rng = np.random.default_rng(0)
        env.reset(seed=settings.resets)
        actions = _actions_for(env)
        picks = rng.integers(0, len(actions), size=settings.steps).tolist()
        stepping = 0.0
        episodes = 1
        for i in picks:
            action = actions[i]
            t0 = clock()
            _, _, terminated, truncated, _ = env.step(action)
            stepping += clock() - t0
            if terminated or truncated:
                env.reset(seed=settings.resets + episodes)
                episodes += 1
                actions = _actions_for(env)
    finally:
        env.close()
    if resets:
        row.reset_ms_mean = statistics.fmean(resets) * 1e3
        row.reset_ms_p95 = float(np.percentile(resets, 95)) * 1e3
    if settings.steps:
        row.step_us_mean = stepping / settings.steps * 1e6
    row.resets, row.steps = settings.resets, settings.steps
    return row


# ------------------------------------------------------------------ room generation
def load_gym_room_utils() -> ModuleType | None:
    """gym_sokoban's ``room_utils`` module, or None when gym_sokoban is not installed.

    Loaded from its file: the package's ``__init__`` imports ``pkg_resources`` (gone from
    recent setuptools) and ``gym``, neither of which ``room_utils`` needs.
    """
    spec = importlib.util.find_spec("gym_sokoban")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "envs" / "room_utils.py"
    module_spec = importlib.util.spec_from_file_location("_gym_sokoban_room_utils", path)
    if not path.exists() or module_spec is None or module_spec.loader is None:
        return None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def _timed_block(fn: Callable[[], int], n: int) -> tuple[float, int]:
    """Seconds for ``n`` calls of ``fn`` and the failures they report."""
    failures = 0
    t0 = time.perf_counter()
    for _ in range(n):
        failures += fn()
    return time.perf_counter() - t0, failures


def measure_generation(case: str, num_boxes: int, settings: Settings,
                       gym: ModuleType | None) -> GenRow:
    """Mean time per usable 6x6 room, ours vs gym_sokoban, in alternating blocks."""
    from turnpool.envs.sokoban_gen import generate, num_gen_steps

    dim = (6, 6)
    seeds = iter(range(10**9))

    def ours() -> int:
        return generate(next(seeds), dim, num_boxes, SEARCH_DEPTH)[1]

    def theirs() -> int:
        assert gym is not None
        failures = 0
        while True:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    gym.generate_room(dim=dim, p_change_directions=0.35,
                                      num_steps=num_gen_steps(*dim), num_boxes=num_boxes)
                return failures
            except (RuntimeError, RuntimeWarning):
                failures += 1

    ours_s = gym_s = 0.0
    ours_fail = gym_fail = 0
    done = 0
    while done < settings.rooms:
        n = min(settings.block, settings.rooms - done)
        s, f = _timed_block(ours, n)
        ours_s, ours_fail = ours_s + s, ours_fail + f
        if gym is not None:
            s, f = _timed_block(theirs, n)
            gym_s, gym_fail = gym_s + s, gym_fail + f
        done += n
    rooms = max(1, settings.rooms)
    row = GenRow(case, num_boxes, settings.rooms, ours_s / rooms * 1e3, ours_fail)
    if gym is None:
        row.note = "gym_sokoban not installed (pip install 'turnpool[bench]')"
    elif settings.rooms:
        row.gym_ms, row.gym_failed_calls = gym_s / rooms * 1e3, gym_fail
        row.speedup = gym_s / ours_s if ours_s > 0 else None
    return row


# ------------------------------------------------------------------------- report
def run_benchmark(settings: Settings, progress: Callable[[str], None] = lambda s: None
                  ) -> dict[str, Any]:
    """Measure everything; a JSON-ready report."""
    start = time.perf_counter()
    load_before = os.getloadavg()
    np.random.default_rng(0)  # numpy imports numpy.random lazily: keep that out of init_ms
    env_rows = []
    for name, case, kwargs in CASES:
        progress(f"{name} {case}")
        env_rows.append(measure_env(name, case, kwargs, settings))
    gym = load_gym_room_utils()
    gen_rows = []
    for case, boxes in GEN_CASES:
        progress(f"room generation {case}")
        gen_rows.append(measure_generation(case, boxes, settings, gym))
    report: dict[str, Any] = {
        "machine": machine_info(numpy=np.__version__, load_average_before=load_before,
                                load_average_after=os.getloadavg()),
        "settings": asdict(settings),
        "envs": [asdict(r) for r in env_rows],
        "generation": [asdict(r) for r in gen_rows],
        "ragen_reference_ms": RAGEN_REFERENCE_MS,
        "ragen_facade": {"stage_identity_vs_gym_sokoban": stage_identity(gym),
                         "visual_transport": measure_visual_transport(),
                         "start_s": measure_facade_start()},
        "elapsed_s": time.perf_counter() - start,
    }
    report["goals"] = goals(report)
    return report


def goals(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets with what this run measured."""
    out = []
    for row in report["generation"]:
        v = row["speedup"]
        out.append({"goal": f"room generation {row['case']}: gym_sokoban / ours",
                    "target": f">= {GOAL_SPEEDUP:g}x", "measured": v,
                    "met": None if v is None else v >= GOAL_SPEEDUP})
    start_s = report["ragen_facade"]["start_s"]["3 tags x 2, default (in-process)"]
    out.append({"goal": "RAGEN facade start (construct + reset), no processes",
                "target": "<= 0.5 s", "measured": start_s, "met": start_s <= 0.5})
    step = next((r["step_us_mean"] for r in report["envs"]
                 if r["env"] == "sokoban" and r["kwargs"].get("num_boxes") == 1), None)
    out.append({"goal": "sokoban 6x6/1: mean step", "target": f"<= {GOAL_STEP_US:g} µs",
                "measured": step, "met": None if step is None else step <= GOAL_STEP_US})
    return out


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render(report: dict[str, Any]) -> list[Any]:
    """Rich renderables for the report."""
    from rich.table import Table

    envs = Table(title="turnpool bench envs: one env in-process (means; p95 for resets)")
    for col in ("env", "case", "init ms", "reset ms", "reset p95 ms", "step µs", "note"):
        envs.add_column(col, justify="left" if col in ("env", "case", "note") else "right")
    for r in report["envs"]:
        envs.add_row(r["env"], r["case"], _fmt(r["init_ms"], 2), _fmt(r["reset_ms_mean"]),
                     _fmt(r["reset_ms_p95"]), _fmt(r["step_us_mean"], 2), escape(r["note"]))

    gen = Table(title="Sokoban room generation per usable room, retries included (6x6/k: k boxes)")
    for col in ("case", "rooms", "ours ms", "gym_sokoban ms", "speedup", "ours retries",
                "gym retries", "note"):
        gen.add_column(col, justify="left" if col in ("case", "note") else "right")
    for r in report["generation"]:
        gen.add_row(r["case"], str(r["rooms"]), _fmt(r["ours_ms"]), _fmt(r["gym_ms"]),
                    "-" if r["speedup"] is None else f"{r['speedup']:.1f}x",
                    str(r["ours_failed_attempts"]), str(r["gym_failed_calls"]), escape(r["note"]))

    rf = report["ragen_facade"]
    vt = rf["visual_transport"]
    facade = Table(title="RAGEN facade")
    facade.add_column("what")
    facade.add_column("measured", justify="right")
    facade.add_row("6x6 rooms whose topology + placement are gym_sokoban's (same local RNGs)",
                   rf["stage_identity_vs_gym_sokoban"])
    facade.add_row(f"{vt['envs']} visual envs: bytes a worker sends per step",
                   f"{vt['reply_bytes_per_step']:,}")
    facade.add_row(f"{vt['envs']} visual envs: bytes if frames were pickled",
                   f"{vt['pickled_frames_bytes_per_step']:,}")
    facade.add_row(f"{vt['envs']} visual envs: drawing the frames in the driver, ms",
                   _fmt(vt["driver_draw_ms_per_step"], 1))
    facade.add_row(f"{vt['envs']} frames via shared memory: descriptor bytes pickled",
                   f"{vt['shm_descriptor_bytes_per_step']:,}")
    facade.add_row(f"{vt['envs']} frames via shared memory: bytes copied (once), ms to read",
                   f"{vt['shm_bytes_copied_per_step']:,} / {vt['shm_read_ms_per_step']:.1f}")
    for name, secs in rf["start_s"].items():
        facade.add_row(f"start: {name}, s", _fmt(secs, 3))

    table = Table(title="goals (measured on a shared machine: noisy)")
    for col in ("goal", "target", "measured", "met"):
        table.add_column(col)
    for g in report["goals"]:
        table.add_row(g["goal"], g["target"], _fmt(g["measured"], 2),
                      {True: "yes", False: "no", None: "-"}[g["met"]])
    ref = report["ragen_reference_ms"]
    load = report["machine"]
    return [envs, gen, facade, table,
            "RAGEN reference (measured separately on the 2-core development machine, not in "
            f"this run): reset {ref['reset 6x6/1']} ms (6x6/1), "
            f"{ref['reset 6x6/3']} ms (6x6/3); step {ref['step']} ms.",
            f"load average before/after: {load['load_average_before'][0]:.2f} / "
            f"{load['load_average_after'][0]:.2f} on {load['cpu_count']} cores"]


@click.command(name="envs")
@json_option("Write the report (env rows, generation rows, goals) as JSON.")
@click.option("--resets", type=click.IntRange(min=1), default=Settings.resets,
              show_default=True, help="Seeded resets per env.")
@click.option("--steps", type=click.IntRange(min=1), default=Settings.steps,
              show_default=True, help="Timed steps per env.")
@click.option("--rooms", type=click.IntRange(min=1), default=Settings.rooms,
              show_default=True, help="Rooms per generator and case in the Sokoban comparison.")
def command(json_path: Path | None, resets: int, steps: int, rooms: int) -> None:
    """Reset/step time of every built-in env; Sokoban generation vs gym_sokoban."""
    console = start()
    settings = Settings(resets=resets, steps=steps, rooms=rooms)
    report = measure_and_print(console, lambda progress: run_benchmark(settings, progress),
                               render)
    console.print(f"elapsed {report['elapsed_s']:.1f} s")
    write_outputs(console, report, json_path)


__all__ = ["Settings", "command", "measure_env", "measure_generation", "run_benchmark"]
