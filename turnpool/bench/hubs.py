"""``turnpool bench hubs``: env-steps/s of other libraries' envs through an `EnvPool` against
the library's own sequential loop, on the same ids, seeds and actions.

Per library (GEM: eight game ids; reasoning-gym: ten datasets; SkyRL-gym: its three math ids
with turnpool's generated tasks; TextArena: six one- and two-player games; verifiers: five of
turnpool's bundled tasksets, scored by ``Task.score``), ``--copies`` envs of each id play
``--rounds`` episodes of at most ``--steps`` steps. The library's loop is what a user of the
library writes: build each env once, then reset with a seed and step, one env after the
other, in this process (reasoning-gym: a dataset per chunk of seeds, ``score_answer`` per
answer). The pool runs the same episodes through `turnpool.make` names on the sequential
backend (the adapter's own cost: global RNG scope, plain infos) and on the process backend
(``--workers`` worker processes). Resets are counted in the time, not in the steps.

    turnpool bench hubs --json hubs.json
    turnpool bench hubs --rounds 2 --copies 2      # quicker
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from turnpool.bench.harness import (
    ProgressFn,
    json_option,
    machine_info,
    measure_and_print,
    start,
    write_outputs,
)

#: library prefix -> the library's ids measured
IDS: dict[str, tuple[str, ...]] = {
    "gem": ("game:GuessTheNumber-v0-easy", "game:Mastermind-v0-easy", "game:Minesweeper-v0-easy",
            "game:TowerofHanoi-v0-easy", "game:Game2048-v0-easy", "game:Sokoban-v0-easy",
            "game:Sudoku-v0-easy", "game:Crosswords-v0-easy"),
    "rg": ("leg_counting", "basic_arithmetic", "countdown", "arc_1d", "family_relationships",
           "chain_sum", "word_sorting", "letter_counting", "spell_backward", "gsm_symbolic"),
    "skyrl": ("gsm8k", "gsm8k_multi_turn", "aime"),
    "textarena": ("TicTacToe-v0", "ConnectFour-v0", "Nim-v0", "KuhnPoker-v0",
                  "GuessTheNumber-v0", "Mastermind-v0"),
    "verifiers": ("add-easy", "mul-hard", "reverse-easy", "count-hard", "sort-hard"),
}
#: the actions each library's episodes take, in turn (GEM parses ``\\boxed{...}``)
ACTIONS: dict[str, tuple[str, ...]] = {
    "gem": ("\\boxed{up}", "\\boxed{1 2}", "\\boxed{3}", "\\boxed{A B 1}", "\\boxed{left}"),
    "rg": ("1",),
    "skyrl": ("#### 1", "Answer: 2", "#### 3"),
    "textarena": ("[4]", "[0]", "[1]", "[2]", "[3]", "[5]"),
    "verifiers": ("1",),
}
RG_SIZE = 50


def _gem_loop(ids: tuple[str, ...], copies: int, rounds: int, steps: int) -> tuple[int, float]:
    import gem

    envs = [gem.make(i) for i in ids for _ in range(copies)]
    actions, done = ACTIONS["gem"], 0
    t0 = time.perf_counter()
    for r in range(rounds):
        for k, env in enumerate(envs):
            env.reset(seed=r * len(envs) + k)
            for t in range(steps):
                done += 1
                _, _, term, trunc, _ = env.step(actions[t % len(actions)])
                if term or trunc:
                    break
    return done, time.perf_counter() - t0


def _rg_loop(ids: tuple[str, ...], copies: int, rounds: int, steps: int) -> tuple[int, float]:
    from reasoning_gym import create_dataset

    names = [i for i in ids for _ in range(copies)]
    data: dict[tuple[str, int], Any] = {}
    done = 0
    t0 = time.perf_counter()
    for r in range(rounds):
        for k, name in enumerate(names):
            seed = r * len(names) + k
            key = (name, seed // RG_SIZE)
            if key not in data:
                data[key] = create_dataset(name, seed=key[1], size=RG_SIZE)
            entry = data[key][seed % RG_SIZE]
            try:
                data[key].score_answer(ACTIONS["rg"][0], entry)
            except Exception:  # noqa: BLE001, S110 - a scorer that chokes: as the adapter does
                pass
            done += 1
    return done, time.perf_counter() - t0


def _skyrl_loop(ids: tuple[str, ...], copies: int, rounds: int, steps: int
                ) -> tuple[int, float]:
    import skyrl_gym

    from turnpool.envs.hubs.skyrl import generated_row

    names = [i for i in ids for _ in range(copies)]
    actions, done = ACTIONS["skyrl"], 0
    t0 = time.perf_counter()
    for r in range(rounds):
        for k, name in enumerate(names):
            row = generated_row(name, r * len(names) + k)
            env = skyrl_gym.make(name, env_config=None, extras=row)
            env.init(row["prompt"])
            for t in range(steps):
                done += 1
                if env.step(actions[t % len(actions)])["done"]:
                    break
            env.close()
    return done, time.perf_counter() - t0


def _textarena_loop(ids: tuple[str, ...], copies: int, rounds: int, steps: int
                    ) -> tuple[int, float]:
    import textarena

    from turnpool.envs.hubs.textarena import seats_of

    names = [i for i in ids for _ in range(copies)]
    seats = {i: seats_of(i) for i in ids}
    actions, done = ACTIONS["textarena"], 0
    t0 = time.perf_counter()
    for r in range(rounds):
        for k, name in enumerate(names):
            env = textarena.make(name)  # a game a reset, as the adapter does
            env.reset(num_players=seats[name], seed=r * len(names) + k)
            for t in range(steps):
                env.get_observation()
                done += 1
                if env.step(action=actions[t % len(actions)])[0]:
                    env.close()
                    break
    return done, time.perf_counter() - t0


def _verifiers_loop(ids: tuple[str, ...], copies: int, rounds: int, steps: int
                    ) -> tuple[int, float]:
    """Each taskset built once; every reply scored by `Task.score` on a fresh trace."""
    import asyncio

    import verifiers.v1 as vf
    from verifiers.v1.trace import AgentInfo, Trace, TraceTask

    from turnpool.envs.hubs.verifiers_tasks import taskset

    t0 = time.perf_counter()
    rows = {i: list(taskset(i, seed=0)) for i in ids}
    done = 0
    for r in range(rounds):
        for k, name in enumerate(i for i in ids for _ in range(copies)):
            task = rows[name][(r * len(ids) * copies + k) % len(rows[name])]
            trace = Trace(task=TraceTask(type=type(task).__name__, data=task.data),
                          agent=AgentInfo(config=vf.AgentConfig()), root_reply="1")
            asyncio.run(task.score(trace))
            done += 1
    return done, time.perf_counter() - t0


LOOPS: dict[str, Callable[[tuple[str, ...], int, int, int], tuple[int, float]]] = {
    "gem": _gem_loop, "rg": _rg_loop, "skyrl": _skyrl_loop, "textarena": _textarena_loop,
    "verifiers": _verifiers_loop}


def _pool(prefix: str, backend: str, workers: int, copies: int, rounds: int, steps: int
          ) -> tuple[int, float]:
    from turnpool.pool.api import EnvGroupSpec, EnvPool

    kwargs = {"size": RG_SIZE} if prefix == "rg" else {}
    specs = [EnvGroupSpec(f"t{n}", f"{prefix}:{i}", copies, dict(kwargs))
             for n, i in enumerate(IDS[prefix])]
    options: dict[str, Any] = {"num_workers": workers} if backend != "sequential" else {}
    actions, done = ACTIONS[prefix], 0
    with EnvPool.from_specs(specs, group_n=1, seed=0, backend=backend, **options) as pool:
        n = pool.num_envs
        t0 = time.perf_counter()
        for r in range(rounds):
            pool.reset(seed=r * n)
            live = list(range(n))
            for t in range(steps):
                if not live:
                    break
                _, _, dones, _ = pool.step([actions[t % len(actions)]] * len(live), env_ids=live)
                done += len(live)
                live = [k for k, d in zip(live, dones) if not d]
        return done, time.perf_counter() - t0


def measure(copies: int, rounds: int, steps: int, workers: int,
            progress: ProgressFn) -> dict[str, Any]:
    rows = []
    for prefix in IDS:
        cases = [("library loop", "library", 1), ("pool sequential", "sequential", 1),
                 (f"pool process x{workers}", "process", workers)]
        for label, backend, n_workers in cases:
            progress(f"{prefix}: {label}")
            n, secs = (LOOPS[prefix](IDS[prefix], copies, rounds, steps) if backend == "library"
                       else _pool(prefix, backend, n_workers, copies, rounds, steps))
            rows.append({"library": prefix, "ids": len(IDS[prefix]), "how": label,
                         "steps": n, "seconds": secs, "steps_per_s": n / secs})
    return {"machine": machine_info(load_avg=os.getloadavg()[0]), "copies": copies,
            "rounds": rounds, "max_steps": steps, "rows": rows}


def render(report: dict[str, Any]) -> list[Any]:
    table = Table(title=f"library envs: env-steps/s (load {report['machine']['load_avg']:.1f})")
    for col in ("library", "ids", "how", "steps", "env-steps/s"):
        table.add_column(col, justify="right" if col in ("ids", "steps", "env-steps/s")
                         else "left")
    for r in report["rows"]:
        table.add_row(r["library"], str(r["ids"]), r["how"], str(r["steps"]),
                      f"{r['steps_per_s']:,.0f}")
    return [table]


@click.command()
@click.option("--copies", default=4, show_default=True, help="Envs per id.")
@click.option("--rounds", default=3, show_default=True, help="Episodes per env.")
@click.option("--steps", default=5, show_default=True, help="Most steps per episode.")
@click.option("--workers", default=2, show_default=True, help="Process backend's workers.")
@json_option("Write the report as JSON.")
def command(copies: int, rounds: int, steps: int, workers: int, json_path: Path | None) -> None:
    """Library envs (GEM, reasoning-gym, SkyRL-gym, verifiers): the pool vs their own loops."""
    console = start(width=100)
    report = measure_and_print(
        console, lambda progress: measure(copies, rounds, steps, workers, progress), render)
    write_outputs(console, report, json_path)
