"""``turnpool bench webshop``: steps/s of webshop envs on the pool's backends, in one run.

The shop runs in its own process (``turnpool webshop serve``), as a real deployment would, so
its CPU time can be measured apart from the envs' (psutil). Every env browses without buying:
it searches with its goal's words, then clicks among the page's links (a seeded generator per
env picks which), so no episode ends while it is timed and every step is one HTTP request. The
same seeds give the same clicks on every backend, so each backend does identical work.

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
from pathlib import Path
from typing import Any

import click
import numpy as np

from turnpool.bench.harness import json_option, measure_and_print, start, write_outputs

log = logging.getLogger(__name__)

BACKENDS = ("sequential", "thread", "process")


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
        t0 = time.perf_counter()
        valid = 0
        for _ in range(steps):
            obs, _, dones, infos = pool.step([browse(o, r) for o, r in zip(obs, rngs)])
            valid += sum(bool(i.get("action_is_valid")) for i in infos)
            if any(dones):
                raise RuntimeError("an episode ended during timing; raise max_steps")
        wall = time.perf_counter() - t0
        shop_cpu, client_cpu = shop.cpu_seconds() - shop0, _client_cpu_seconds() - client0
        active, n_workers = pool.backend_name, pool.num_workers
    return {"backend": backend, "active_backend": active, "workers": n_workers,
            "envs": n_envs, "steps": steps, "wall_s": wall, "reset_s": reset_s,
            "steps_per_s": n_envs * steps / wall, "ms_per_pool_step": wall / steps * 1000,
            "valid_ratio": valid / (n_envs * steps), "shop_cores": shop_cpu / wall,
            "client_cores": client_cpu / wall}


def run(n_envs: int = 64, steps: int = 20, group_n: int = 4, threads: int | None = None,
        processes: int | None = None, latencies_ms: tuple[float, ...] = (0.0, 2.0),
        backends: tuple[str, ...] = BACKENDS) -> dict[str, Any]:
    """Measure each backend against one shop process per latency; returns the report."""
    if n_envs % group_n:
        raise click.BadParameter(f"--envs ({n_envs}) must be a multiple of --group-n ({group_n})")
    rows = []
    for latency in latencies_ms:
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
        base = next((r["steps_per_s"] for r in rows
                     if r["backend"] == "sequential" and r["latency_ms"] == latency), None)
        for r in rows:
            if r["latency_ms"] == latency:
                r["speedup_vs_sequential"] = r["steps_per_s"] / base if base else None
    return {"benchmark": "webshop", "envs": n_envs, "group_n": group_n, "steps": steps,
            "latencies_ms": list(latencies_ms), "cpus": os.cpu_count(),
            "python": platform.python_version(), "machine": platform.machine(), "rows": rows}


def render(report: dict[str, Any]) -> list[Any]:
    """The report as a table and its legend."""
    from rich.table import Table

    table = Table(title=f"webshop: {report['envs']} envs (groups of {report['group_n']}), "
                        f"{report['steps']} timed steps each, {report['cpus']} cpus")
    for col in ("latency", "backend", "workers", "steps/s", "ms/step", "x seq", "shop cpu",
                "client cpu"):
        table.add_column(col, justify="left" if col == "backend" else "right")
    for r in report["rows"]:
        name = r["backend"] if r["active_backend"] == r["backend"] else \
            f"{r['backend']} (ran {r['active_backend']})"
        speed = r["speedup_vs_sequential"]
        table.add_row(f"{r['latency_ms']:g} ms", name, str(r["workers"]),
                      f"{r['steps_per_s']:.0f}", f"{r['ms_per_pool_step']:.1f}",
                      f"{speed:.2f}" if speed else "-", f"{r['shop_cores']:.2f}",
                      f"{r['client_cores']:.2f}")
    return [table, "ms/step: one pool step of all envs; x seq: speedup over sequential at the "
                   "same latency; shop/client cpu: cores used (CPU seconds per wall second) by "
                   "the shop process and by this process with its workers."]


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
@click.option("--backends", default=",".join(BACKENDS), show_default=True)
@json_option("Also write the report as JSON here.")
def command(n_envs: int, steps: int, group_n: int, threads: int | None,
            processes: int | None, latency: str, backends: str,
            json_path: Path | None) -> None:
    """Steps/s of webshop envs on the sequential, thread and process backends."""
    chosen = tuple(b.strip() for b in backends.split(",") if b.strip())
    try:
        latencies = tuple(float(x) for x in latency.split(",") if x.strip())
    except ValueError as exc:
        raise click.BadParameter(f"--latency-ms must be numbers separated by commas: {exc}") \
            from exc
    console = start()
    report = measure_and_print(
        console, lambda progress: run(n_envs, steps, group_n, threads, processes, latencies,
                                      chosen), render)
    write_outputs(console, report, json_path)
