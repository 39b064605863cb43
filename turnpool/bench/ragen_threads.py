"""RAGEN v2's ``parallel_friendly`` threads vs turnpool's pool, on the same envs and seeds.

RAGEN v2 (PR #143) runs a tag's ``reset`` / ``step`` calls on a ``ThreadPoolExecutor`` of
``max_workers`` threads when the tag is ``parallel_friendly``. This bench plays one rollout
(reset, then ``turns`` turns of 1-3 actions per env, finished envs left alone, as RAGEN's
manager does) of ``n_envs`` envs in groups of 4 (one seed per group):

* RAGEN sequential: RAGEN's own env classes, one call after the other (the reference);
* RAGEN threads: the same calls on ``workers`` threads, as ``parallel_friendly`` runs them;
* turnpool sequential / process: turnpool's native env of the same type in an `EnvPool`.

Each line gives the wall time and how many envs' traces (texts, rewards, dones) differ from
RAGEN's sequential run. RAGEN's code is not part of turnpool: pass ``--ragen`` the root of a
RAGEN v2 checkout (its ``ragen/`` folder is imported, its package ``__init__`` files are not,
so its training dependencies need not be installed); without it the RAGEN lines are skipped.

    turnpool bench ragen-threads --ragen ~/src/RAGEN --json out.json
"""

from __future__ import annotations

import functools
import importlib
import sys
import time
import types
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click
import numpy as np

from turnpool.bench.harness import machine_info, measure_and_print, start, write_outputs

#: name -> (RAGEN module, env class, config class, turnpool env type, env_config, action ids)
CASES: dict[str, tuple[str, str, str, str, dict[str, Any], tuple[Any, ...]]] = {
    "SimpleSokoban": ("sokoban", "SokobanEnv", "SokobanEnvConfig", "sokoban",
                      {"dim_x": 6, "dim_y": 6, "num_boxes": 1, "max_steps": 100}, (1, 2, 3, 4)),
    "SimpleSudoku": ("sudoku", "SudokuEnv", "SudokuEnvConfig", "sudoku",
                     {"grid_size": 9, "difficulty": "easy", "render_format": "with_feedback",
                      "max_steps": 81}, ("1,1,5", "place 3 at row 2 col 4", "9,9,9", "5,5,1")),
}
GROUP = 4

Trace = list[Any]


def load_ragen(root: Path, case: str) -> Callable[[], Any]:
    """A factory of RAGEN's env for ``case``, imported from the checkout at ``root``."""
    module, env_cls, config_cls, _, env_config, _ = CASES[case]
    for name, folder in (("ragen", root / "ragen"), ("ragen.env", root / "ragen" / "env")):
        if name not in sys.modules:  # bare packages: skip RAGEN's __init__ imports
            package = types.ModuleType(name)
            package.__path__ = [str(folder)]
            sys.modules[name] = package
    env_module = importlib.import_module(f"ragen.env.{module}.env")
    config_module = importlib.import_module(f"ragen.env.{module}.config")
    cls, config = vars(env_module)[env_cls], vars(config_module)[config_cls]
    return lambda: cls(config(**env_config))


def actions_for(case: str, n_envs: int, turns: int) -> list[list[list[Any]]]:
    """``[turn][env] -> actions`` (1-3 per turn), the same for every runner."""
    choices = CASES[case][5]
    rs = np.random.RandomState(0)
    return [[[choices[int(i)] for i in rs.randint(0, len(choices), size=rs.randint(1, 4))]
             for _ in range(n_envs)] for _ in range(turns)]


def _ragen_turn(env: Any, actions: list[Any], trace: Trace) -> bool:
    reward, done, obs = 0.0, False, None
    for action in actions:
        obs, r, done, _ = env.step(action)
        reward += float(r)
        if done:
            break
    trace.append((obs, round(reward, 9), bool(done)))
    return bool(done)


def _ragen_turn_of(envs: list[Any], turn: list[list[Any]], traces: list[Trace], i: int
                   ) -> bool:
    return _ragen_turn(envs[i], turn[i], traces[i])


def run_ragen(factory: Callable[[], Any], n_envs: int, plan: list[list[list[Any]]],
              workers: int) -> tuple[float, list[Trace]]:
    """RAGEN's envs driven as its manager drives them (``workers`` > 1: on threads)."""
    envs = [factory() for _ in range(n_envs)]
    traces: list[Trace] = [[] for _ in range(n_envs)]
    done = [False] * n_envs
    pool = ThreadPoolExecutor(max_workers=workers) if workers > 1 else None

    def each(fn: Callable[[int], Any], ids: list[int]) -> list[Any]:
        if pool is None:
            return [fn(i) for i in ids]
        return [f.result() for f in [pool.submit(fn, i) for i in ids]]

    start_s = time.perf_counter()
    for i, text in enumerate(each(lambda i: envs[i].reset(seed=1000 + i // GROUP),
                                  list(range(n_envs)))):
        traces[i].append((text[0] if isinstance(text, tuple) else text, 0.0, False))
    for turn in plan:
        live = [i for i in range(n_envs) if not done[i]]
        step = functools.partial(_ragen_turn_of, envs, turn, traces)
        for i, finished in zip(live, each(step, live), strict=True):
            done[i] = finished
    elapsed = time.perf_counter() - start_s
    if pool is not None:
        pool.shutdown()
    return elapsed, traces


def run_turnpool(case: str, backend: str, n_envs: int, plan: list[list[list[Any]]],
                 workers: int) -> tuple[float, list[Trace]]:
    """turnpool's native env of the same type and config in an `EnvPool`."""
    from turnpool import EnvPool

    _, _, _, env_type, env_config, _ = CASES[case]
    with EnvPool(env_type, env_num=n_envs // GROUP, group_n=GROUP, seed=1000,
                 env_kwargs=env_config, backend=backend,
                 num_workers=None if backend == "sequential" else workers) as pool:
        start_s = time.perf_counter()
        obs, _ = pool.reset()
        traces: list[Trace] = [[(o, 0.0, False)] for o in obs]
        done = [False] * n_envs
        for turn in plan:
            live = [i for i in range(n_envs) if not done[i]]
            for i, res in zip(live, pool.step_turns([turn[i] for i in live], env_ids=live),
                              strict=True):
                traces[i].append((res.obs, round(res.reward_sum, 9), bool(res.done)))
                done[i] = bool(res.done)
        return time.perf_counter() - start_s, traces


def differing(traces: list[Trace], reference: list[Trace]) -> int:
    return sum(a != b for a, b in zip(traces, reference, strict=True))


def run_benchmark(ragen: Path | None, n_envs: int, workers: int, turns: int, repeats: int,
                  progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    rows = []
    for case in CASES:
        plan = actions_for(case, n_envs, turns)
        reference: list[Trace] | None = None
        runners: list[tuple[str, Callable[[], tuple[float, list[Trace]]]]] = []
        if ragen is not None:
            factory = load_ragen(ragen, case)
            runners += [("RAGEN sequential", functools.partial(run_ragen, factory, n_envs,
                                                               plan, 1)),
                        (f"RAGEN threads ({workers})",
                         functools.partial(run_ragen, factory, n_envs, plan, workers))]
        runners += [(f"turnpool {b}", functools.partial(run_turnpool, case, b, n_envs, plan,
                                                        workers))
                    for b in ("sequential", "process")]
        for label, runner in runners:
            progress(f"{case}: {label}")
            times, diffs = [], []
            for _ in range(repeats):
                elapsed, traces = runner()
                reference = reference or traces
                times.append(elapsed)
                diffs.append(differing(traces, reference))
            rows.append({"case": case, "runner": label, "ms": [round(t * 1e3, 1) for t in times],
                         "differ": diffs, "reference": "RAGEN sequential" if ragen else label})
    return {"machine": machine_info(), "n_envs": n_envs, "workers": workers, "turns": turns,
            "ragen": str(ragen) if ragen else None, "rows": rows}


def render(report: dict[str, Any]) -> list[Any]:
    from rich.table import Table

    table = Table(title=f"{report['n_envs']} envs, {report['turns']} turns "
                        f"(differ: envs whose trace is not RAGEN's sequential one)")
    for col in ("case", "runner", "ms per rollout (each repeat)", "envs that differ"):
        table.add_column(col)
    for row in report["rows"]:
        table.add_row(row["case"], row["runner"], ", ".join(f"{t:.0f}" for t in row["ms"]),
                      ", ".join(str(d) for d in row["differ"]))
    out: list[Any] = [table]
    if report["ragen"] is None:
        out.append("RAGEN lines skipped: pass --ragen PATH (a RAGEN v2 checkout); differ "
                   "counts are then against turnpool's first runner")
    return out


@click.command("ragen-threads")
@click.option("--ragen", "ragen", type=click.Path(exists=True, file_okay=False, path_type=Path),
              default=None, help="Root of a RAGEN v2 checkout (its ragen/ folder is imported).")
@click.option("--envs", "n_envs", type=click.IntRange(min=GROUP), default=32, show_default=True,
              help="Envs in the pool.")
@click.option("--workers", type=click.IntRange(min=2), default=8, show_default=True,
              help="Threads (turnpool's thread backend and RAGEN's pool alike).")
@click.option("--turns", type=click.IntRange(min=1), default=5, show_default=True,
              help="Turns per episode.")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Timed repeats of each side (the median is reported).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Also write the report as JSON.")
def command(ragen: Path | None, n_envs: int, workers: int, turns: int, repeats: int,
            json_path: Path | None) -> None:
    """RAGEN v2's parallel_friendly threads vs turnpool sequential / process."""
    console = start()
    report = measure_and_print(
        console, lambda progress: run_benchmark(ragen, n_envs - n_envs % GROUP, workers, turns,
                                                repeats, progress), render)
    write_outputs(console, report, json_path)


if __name__ == "__main__":
    command()
