"""``turnpool bench fork``: what branching an env mid-episode costs.

For each env (default Sokoban, FrozenLake, Countdown) and each place (``in-process``: the
``sequential`` backend; ``process``: two worker processes, the source on one and the
destination on the other), a pool of four envs is reset with one seed, env 0 takes one
step (Countdown: none, its episodes are one answer long) and ``pool.fork(0, [dst])`` runs
``--forks`` times; each call is timed with ``time.perf_counter``. Reported: fork latency p50 /
p99 in microseconds, forks/s (calls over their summed time, one caller) and the pickled
size of the source's `Snapshot` in bytes.
"""

from __future__ import annotations

import json
import pickle
import time
from pathlib import Path
from typing import Any

import click

from turnpool.bench.harness import json_option, machine_info
from turnpool.pool import EnvPool

#: env -> its first action (None: fork right after the reset)
FIRST_ACTION: dict[str, Any] = {"sokoban": "Up", "frozen_lake": "Left", "countdown": None}
PLACES = {"in-process": ("sequential", 1, 1), "process": ("process", 2, 3)}


def measure(env: str, place: str, forks: int) -> dict[str, Any]:
    """One row: ``forks`` forks of env 0 of a fresh pool of ``env`` at ``place``."""
    backend, workers, dst = PLACES[place]
    with EnvPool(env, env_num=4, seed=0, backend=backend, num_workers=workers) as pool:
        pool.reset(seed=1)
        if FIRST_ACTION[env] is not None:
            pool.step([FIRST_ACTION[env]], env_ids=[0])
        size = len(pickle.dumps(pool.snapshot([0])[0]))
        for _ in range(min(50, forks)):  # warm-up
            pool.fork(0, [dst])
        times = []
        for _ in range(forks):
            t0 = time.perf_counter()
            pool.fork(0, [dst])
            times.append(time.perf_counter() - t0)
    times.sort()
    return {"env": env, "place": place, "forks": forks,
            "p50_us": 1e6 * times[len(times) // 2],
            "p99_us": 1e6 * times[min(len(times) - 1, int(len(times) * 0.99))],
            "forks_per_s": len(times) / sum(times), "snapshot_bytes": size}


@click.command("fork")
@click.option("--env", "envs", multiple=True, type=click.Choice(list(FIRST_ACTION)),
              help="Envs to measure (default: all three).")
@click.option("--forks", default=2000, show_default=True, help="Timed forks per row.")
@json_option("Write the rows as JSON here.")
def command(envs: tuple[str, ...], forks: int, json_path: Path | None) -> None:
    """Fork latency p50/p99, forks/s and snapshot size, in-process and on process workers."""
    rows = [measure(env, place, forks) for env in envs or tuple(FIRST_ACTION)
            for place in PLACES]
    click.echo(f"{'env':<12} {'place':<11} {'p50 µs':>9} {'p99 µs':>9} {'forks/s':>9} "
               f"{'snapshot B':>10}")
    for r in rows:
        click.echo(f"{r['env']:<12} {r['place']:<11} {r['p50_us']:>9.1f} {r['p99_us']:>9.1f} "
                   f"{r['forks_per_s']:>9.0f} {r['snapshot_bytes']:>10}")
    if json_path is not None:
        json_path.write_text(json.dumps({"machine": machine_info(), "rows": rows}, indent=1))
