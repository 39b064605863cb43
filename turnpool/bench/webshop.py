"""``turnpool bench webshop``: steps/s of webshop envs on the pool's backends, in one run.

Two tasks (``--tasks``): ``ragen``, RAGEN's WebShop on its real small set (the ``webshop`` env:
in process, Lucene-equivalent search, no HTTP), and ``lite``, the synthetic shop over HTTP (the
``webshop_lite`` env). For ``lite`` the shop runs in its own process (``turnpool webshop
serve``), as a real deployment would, so its CPU time can be measured apart from the envs'
(psutil). Every env browses without buying: it searches with its goal's words, then clicks
among the page's links (a seeded generator per env picks which), so no episode ends while it
is timed (for ``lite`` every step is one HTTP request). The same seeds give the same clicks
on every backend, so each backend does identical work.

Columns: ``steps/s`` (env steps per second, all envs together), ``x seq`` (speedup over the
sequential backend at the same latency), ``shop cpu`` (the shop process's CPU seconds per wall
second) and ``client cpu`` (this process and its workers). On a machine with few cores, client
and shop compete for the same cores; the numbers say how much each used.

    turnpool bench webshop --envs 64 --steps 20 --json webshop.json
    turnpool bench webshop --latency-ms 0,5     # a local shop, then one 5 ms away
"""

from __future__ import annotations

import logging
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import numpy as np

from turnpool.bench.harness import json_option, measure_and_print, start, write_outputs

log = logging.getLogger(__name__)

BACKENDS = ("sequential", "thread", "process")
TASKS = ("ragen", "lite")


class ShopProcess:
    """``turnpool webshop serve`` in a child process; ``url`` once it is listening."""

    def __init__(self, latency_ms: float = 0.0, timeout: float = 60.0) -> None:
        cmd = [sys.executable, "-m", "turnpool.cli", "webshop", "serve", "--port", "0",
               "--latency-ms", str(latency_ms)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        line: list[str] = []
        out = self.proc.stdout
        assert out is not None
        reader = threading.Thread(target=lambda: line.append(out.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        if not line or "http://" not in line[0]:
            self.close()
            raise RuntimeError(f"the shop did not start within {timeout:.0f} s: {line!r}")
        self.url = next(w for w in line[0].split() if w.startswith("http://"))

    def cpu_seconds(self) -> float:
        import psutil

        t = psutil.Process(self.proc.pid).cpu_times()
        return float(t.user + t.system)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _client_cpu_seconds() -> float:
    import psutil

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            continue
    return total


def browse(obs: str, rng: np.random.Generator) -> str:
    """A browsing action for ``obs``: search with the goal's words, else a random link."""
    from turnpool.envs.webshop import oracle

    tail = obs.rsplit("Available actions: ", 1)[-1]
    actions = [a for a in tail.split(", ") if a.startswith(("click[", "search[")) and
               a != "click[buy now]"]
    if "search[<your query>]" in actions:
        return (oracle(obs) or ["search[shoes]"])[0]
    if not actions:  # an env that failed has no page; its done flag stops the run
        return "click[back to search]"
    return actions[int(rng.integers(len(actions)))]


def browse_ragen(obs: str, rng: np.random.Generator) -> str:
    """The same browsing for RAGEN's pages: search the goal's first words, else a random
    listed click other than buying."""
    listed = obs.rsplit("You must choose from these actions:", 1)[-1].rstrip(".")
    actions = [a for a in listed.split(", ") if a.startswith("click[") and a != "click[buy now]"]
    if "search[<content>]" in listed:
        goal = obs.split(".We must buy", 1)[0].removeprefix("Instruction: ")
        goal = goal.split(" [SEP] ")[-2] if " [SEP] " in goal else goal
        return f"search[{' '.join(goal.split()[2:9])}]"
    if not actions:
        return "click[back to search]"
    return actions[int(rng.integers(len(actions)))]


def measure_ragen(backend: str, n_envs: int, group_n: int, steps: int,
                  workers: int | None) -> dict[str, Any]:
    """RAGEN's task in process: no shop process, every step is the env's own work."""
    from turnpool.pool import EnvPool

    rngs = [np.random.default_rng([7, i]) for i in range(n_envs)]
    with EnvPool("webshop", env_num=n_envs // group_n, group_n=group_n, seed=1000,
                 env_kwargs={"split": "train"}, backend=backend, num_workers=workers,
                 step_timeout=120.0) as pool:
        t0 = time.perf_counter()
        obs, _ = pool.reset()
        reset_s = time.perf_counter() - t0
        for _ in range(2):
            obs, _, _, _ = pool.step([browse_ragen(o, r) for o, r in zip(obs, rngs)])
        client0 = _client_cpu_seconds()
        valid, wall = _timed_steps(pool, browse_ragen, obs, rngs, steps)
        client_cpu = _client_cpu_seconds() - client0
        active, n_workers = pool.backend_name, pool.num_workers
    return {"task": "ragen", "backend": backend, "active_backend": active, "workers": n_workers,
            "envs": n_envs, "steps": steps, "wall_s": wall, "reset_s": reset_s,
            "steps_per_s": n_envs * steps / wall, "ms_per_pool_step": wall / steps * 1000,
            "valid_ratio": valid / (n_envs * steps), "shop_cores": 0.0,
            "client_cores": client_cpu / wall, "latency_ms": 0.0}


def _timed_steps(pool: Any, act: Callable[[str, Any], str], obs: list[str], rngs: list[Any],
                 steps: int) -> tuple[int, float]:
    """``steps`` timed pool steps, each env acting with ``act(obs, rng)``: how many actions
    were valid, and the wall seconds. No episode may end while timed."""
    t0 = time.perf_counter()
    valid = 0
    for _ in range(steps):
        obs, _, dones, infos = pool.step([act(o, r) for o, r in zip(obs, rngs)])
        valid += sum(bool(i.get("action_is_valid")) for i in infos)
        if any(dones):
            raise RuntimeError("an episode ended during timing; raise max_steps")
    return valid, time.perf_counter() - t0


def measure(backend: str, url: str, shop: ShopProcess, n_envs: int, group_n: int,
            steps: int, workers: int | None) -> dict[str, Any]:
    from turnpool.pool import EnvPool

    kwargs = {"server_url": url, "split": "train", "max_steps": 10**9}
    rngs = [np.random.default_rng([7, i]) for i in range(n_envs)]
    with EnvPool("webshop_lite", env_num=n_envs // group_n, group_n=group_n, seed=1000,
                 env_kwargs=kwargs, backend=backend, num_workers=workers,
                 step_timeout=120.0) as pool:
        t0 = time.perf_counter()
        obs, _ = pool.reset()
        reset_s = time.perf_counter() - t0
        for _ in range(2):  # warm connections and the shop's search cache equally for all
            obs, _, _, _ = pool.step([browse(o, r) for o, r in zip(obs, rngs)])
        shop0, client0 = shop.cpu_seconds(), _client_cpu_seconds()
        valid, wall = _timed_steps(pool, browse, obs, rngs, steps)
        shop_cpu, client_cpu = shop.cpu_seconds() - shop0, _client_cpu_seconds() - client0
        active, n_workers = pool.backend_name, pool.num_workers
    return {"task": "lite", "backend": backend, "active_backend": active, "workers": n_workers,
            "envs": n_envs, "steps": steps, "wall_s": wall, "reset_s": reset_s,
            "steps_per_s": n_envs * steps / wall, "ms_per_pool_step": wall / steps * 1000,
            "valid_ratio": valid / (n_envs * steps), "shop_cores": shop_cpu / wall,
            "client_cores": client_cpu / wall}


def run(n_envs: int = 64, steps: int = 20, group_n: int = 4, threads: int | None = None,
        processes: int | None = None, latencies_ms: tuple[float, ...] = (0.0, 2.0),
        backends: tuple[str, ...] = BACKENDS, tasks: tuple[str, ...] = TASKS
        ) -> dict[str, Any]:
    """Measure each backend on RAGEN's task and against one shop process per latency."""
    if n_envs % group_n:
        raise click.BadParameter(f"--envs ({n_envs}) must be a multiple of --group-n ({group_n})")
    unknown = set(tasks) - set(TASKS)
    if unknown:
        raise click.BadParameter(f"--tasks: unknown {sorted(unknown)}; choose from {TASKS}")
    rows = []
    if "ragen" in tasks:
        ragen_rows = []
        for backend in backends:
            workers = {"thread": threads, "process": processes}.get(backend)
            ragen_rows.append(measure_ragen(backend, n_envs, group_n, steps, workers))
            log.info("ragen, %s: %.0f steps/s", backend, ragen_rows[-1]["steps_per_s"])
        base = next((r["steps_per_s"] for r in ragen_rows if r["backend"] == "sequential"), None)
        for r in ragen_rows:
            r["speedup_vs_sequential"] = r["steps_per_s"] / base if base else None
        rows += ragen_rows
    for latency in latencies_ms if "lite" in tasks else ():
        shop = ShopProcess(latency)
        try:
            for backend in backends:
                workers = {"thread": threads, "process": processes}.get(backend)
                row = measure(backend, shop.url, shop, n_envs, group_n, steps, workers)
                row["latency_ms"] = latency
                rows.append(row)
                log.info("%s, latency %g ms: %.0f steps/s", backend, latency,
                         row["steps_per_s"])
        finally:
            shop.close()
        lite = [r for r in rows if r["task"] == "lite" and r["latency_ms"] == latency]
        base = next((r["steps_per_s"] for r in lite if r["backend"] == "sequential"), None)
        for r in lite:
            r["speedup_vs_sequential"] = r["steps_per_s"] / base if base else None
    return {"benchmark": "webshop", "envs": n_envs, "group_n": group_n, "steps": steps,
            "latencies_ms": list(latencies_ms), "cpus": os.cpu_count(),
            "python": platform.python_version(), "machine": platform.machine(), "rows": rows}


def render(report: dict[str, Any]) -> list[Any]:
    """The report as a table and its legend."""
    from rich.table import Table

    table = Table(title=f"webshop: {report['envs']} envs (groups of {report['group_n']}), "
                        f"{report['steps']} timed steps each, {report['cpus']} cpus")
    for col in ("task", "latency", "backend", "workers", "steps/s", "ms/step", "x seq", "shop cpu",
                "client cpu"):
        table.add_column(col, justify="left" if col == "backend" else "right")
    for r in report["rows"]:
        name = r["backend"] if r["active_backend"] == r["backend"] else \
            f"{r['backend']} (ran {r['active_backend']})"
        speed = r["speedup_vs_sequential"]
        latency = "-" if r["task"] == "ragen" else f"{r['latency_ms']:g} ms"
        table.add_row(r["task"], latency, name, str(r["workers"]),
                      f"{r['steps_per_s']:.0f}", f"{r['ms_per_pool_step']:.1f}",
                      f"{speed:.2f}" if speed else "-", f"{r['shop_cores']:.2f}",
                      f"{r['client_cores']:.2f}")
    return [table, "ragen: RAGEN's WebShop on its small set, in process; lite: the synthetic "
                   "shop over HTTP. ms/step: one pool step of all envs; x seq: speedup over "
                   "sequential (same task and latency); shop/client cpu: cores used (CPU "
                   "seconds per wall second) by the shop process and by this process with "
                   "its workers."]


@click.command("webshop")
@click.option("--envs", "n_envs", default=64, show_default=True, help="Envs in the pool.")
@click.option("--steps", default=20, show_default=True, help="Timed pool steps per backend.")
@click.option("--group-n", default=4, show_default=True, help="Envs per group (same goal).")
@click.option("--threads", default=None, type=int, help="Thread-backend workers (default 16).")
@click.option("--processes", default=None, type=int,
              help="Process-backend workers (default: one per core).")
@click.option("--latency-ms", "latency", default="0,2", show_default=True,
              help="Comma list: latency the shop adds to each agent reply without using CPU "
                   "(0 = the shop on this machine; 2 = a shop across a network). One shop "
                   "process per value.")
@click.option("--backends", default=",".join(BACKENDS), show_default=True,
              help="Comma-separated backends to compare.")
@click.option("--tasks", default=",".join(TASKS), show_default=True,
              help="ragen (RAGEN's WebShop, in process) and/or lite (the synthetic shop).")
@json_option("Also write the report as JSON here.")
def command(n_envs: int, steps: int, group_n: int, threads: int | None,
            processes: int | None, latency: str, backends: str, tasks: str,
            json_path: Path | None) -> None:
    """Steps/s of webshop envs on the sequential, thread and process backends."""
    chosen = tuple(b.strip() for b in backends.split(",") if b.strip())
    task_list = tuple(t.strip() for t in tasks.split(",") if t.strip())
    try:
        latencies = tuple(float(x) for x in latency.split(",") if x.strip())
    except ValueError as exc:
        raise click.BadParameter(f"--latency-ms must be numbers separated by commas: {exc}") \
            from exc
    console = start()
    report = measure_and_print(
        console, lambda progress: run(n_envs, steps, group_n, threads, processes, latencies,
                                      chosen, task_list), render)
    write_outputs(console, report, json_path)
