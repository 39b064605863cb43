"""``turnpool bench hol``: what one hanging env costs the sessions that share its worker.

``--sessions`` sessions (default 256) each drive one env of the ``faulty`` test env on
``--backend`` (``process`` by default; ``process_pool``, ``joblib`` and ``ray`` too) with 2
workers, stepping as fast as their replies come. In a ``hang``
window one session's env blocks on every step (``time.sleep``: a stuck web call) until
``--step-timeout`` fails it, then it resets and hangs again; the others are the innocents.
A step counts in the window it ends in, and one still waiting when the window closes
counts with the time it waited so far. Each window runs on a fresh pool or server, and the
windows alternate (uniform, hang, ...) ``--pairs`` times so that a change in the machine's
load hits both alike. Reported per
window: the innocents' step latency p50 / p99 / max (through the pool also for those that
share the hung env's worker) and their steps/s; the summary is the median ratio of the
innocents' p99 with and without the hang.

With ``--slow-factor F`` a third window per pair has 1% of the sessions (at least one) step
``F`` times slower than the env's own step (busy computing), and the others are the
innocents.

``--through pool`` drives the `SlotEngine` (as ``turnpool serve``, TRL and verl do) from one
asyncio loop; ``--through serve`` runs ``turnpool serve`` in a child process and drives it
over WebSockets from another. ``--compare-no-handoff`` adds pool windows with the hand-off
turned off (``handoff_after=None``), the behaviour before it existed.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import click

from turnpool.bench.harness import (
    ProgressFn,
    json_option,
    machine_info,
    measure_and_print,
    start,
    write_outputs,
)

ENV = "faulty"
HUNG = 0  # the session whose env hangs (it holds slot 0: worker 0)
KINDS = ("uniform", "hang", "hang, no hand-off", "1% slow")


def special_actions(kind: str, sessions: int, slow_ms: float) -> dict[int, str]:
    """Session -> the action it steps with in a window of ``kind`` (the rest step ``go``)."""
    if kind.startswith("hang"):
        return {HUNG: "hang"}
    if kind == "1% slow":
        chosen = list(range(50, sessions, 100)) or [sessions // 2]
        return {s: f"busy:{slow_ms:.4f}" for s in chosen}
    return {}


def step_cost_ms() -> float:
    """Milliseconds one step of the env takes here, in this process."""
    from turnpool.envs.registry import make

    env = make(ENV, episode_len=10**9)
    env.reset(seed=0)
    t0 = time.perf_counter()
    for _ in range(20_000):
        env.step("go")
    return (time.perf_counter() - t0) / 20_000 * 1000.0


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000.0


def _summary(lat: dict[int, list[float]], near: set[int], seconds: float,
             guilty: Collection[int]) -> dict[str, Any]:
    """Latency figures of the innocents: all, those in ``near`` (the hung env's worker)."""
    innocent = [x for s, xs in lat.items() if s not in guilty for x in xs]
    close = [x for s, xs in lat.items() if s not in guilty and s in near for x in xs]
    return {"steps_per_s": len(innocent) / seconds, "p50_ms": _pct(innocent, 0.5),
            "p99_ms": _pct(innocent, 0.99), "max_ms": max(innocent) * 1000 if innocent else None,
            "near_p99_ms": _pct(close, 0.99),
            "near_max_ms": max(close) * 1000 if close else None,
            "innocent_errors": 0}


async def _measure(tasks: list[asyncio.Task[None]], lat: dict[int, list[float]],
                   pending: dict[int, float | None], window: list[float], stop: asyncio.Event,
                   warmup: float, seconds: float) -> None:
    """Open the window after ``warmup``, close it ``seconds`` later, stop the sessions. A step
    still waiting when the window ends counts with the time it has waited (a session stalled
    for the whole window must not vanish from the figures)."""
    now = time.perf_counter()
    window[0], window[1] = now + warmup, now + warmup + seconds
    await asyncio.sleep(warmup + seconds)
    for s, t0 in pending.items():
        if t0 is not None and t0 < window[1]:
            lat[s].append(window[1] - t0)
    stop.set()
    await asyncio.wait(tasks, timeout=120)


# ---------------------------------------------------------------------- through the pool
async def _drive_engine(engine: Any, sessions: int, special: dict[int, str], warmup: float,
                        seconds: float) -> tuple[dict[int, list[float]], int]:
    lat: dict[int, list[float]] = {s: [] for s in range(sessions)}
    pending: dict[int, float | None] = {s: None for s in range(sessions)}
    errors = 0
    window = [0.0, 0.0]
    stop = asyncio.Event()

    async def one(s: int) -> None:
        nonlocal errors
        slot = s  # every slot is leased (below): session s drives slot s
        await engine.reset(slot, seed=s)
        action = special.get(s, "go")
        while not stop.is_set():
            t0 = pending[s] = time.perf_counter()
            r = await engine.step(slot, [action], timeout=600)
            t1 = time.perf_counter()
            pending[s] = None
            if window[0] <= t1 <= window[1]:
                lat[s].append(t1 - t0)
            if r.error is not None and s not in special:
                errors += 1
            if r.done:
                await engine.reset(slot, seed=s)

    leased = sorted(engine.lease() for _ in range(sessions))
    assert leased == list(range(sessions))
    tasks = [asyncio.create_task(one(s)) for s in range(sessions)]
    await _measure(tasks, lat, pending, window, stop, warmup, seconds)
    return lat, errors


def _pool_window(sessions: int, special: dict[int, str], handoff: bool, warmup: float,
                 seconds: float, step_timeout: float, backend: str) -> dict[str, Any]:
    from turnpool.pool.slots import SlotEngine

    options: dict[str, Any] = {} if handoff else {"handoff_after": None}
    engine = SlotEngine(ENV, capacity=sessions, backend=backend, num_workers=2,
                        step_timeout=step_timeout, env_kwargs={"episode_len": 10**9},
                        **options)
    try:
        near = set(engine.slots_of(0))
        lat, errors = asyncio.run(_drive_engine(engine, sessions, special, warmup, seconds))
    finally:
        engine.close()
    row = _summary(lat, near, seconds, special)
    row["innocent_errors"] = errors
    return row


# ---------------------------------------------------------------------- through the server
async def _drive_server(url: str, sessions: int, special: dict[int, str], warmup: float,
                        seconds: float) -> dict[str, Any]:
    from turnpool.bench.ws_client import WsClient

    lat: dict[int, list[float]] = {s: [] for s in range(sessions)}
    pending: dict[int, float | None] = {s: None for s in range(sessions)}
    errors = 0
    window = [0.0, 0.0]
    stop = asyncio.Event()
    opened = asyncio.Event()
    ready = 0

    async def one(s: int) -> None:
        nonlocal errors, ready
        ws = await WsClient.connect(url)
        try:
            reset = json.dumps({"type": "reset", "data": {"seed": s}})
            await ws.ask(reset)
            ready += 1
            if ready == sessions:
                opened.set()
            await opened.wait()
            step = json.dumps({"type": "step", "data": {"action": special.get(s, "go")}})
            while not stop.is_set():
                t0 = pending[s] = time.perf_counter()
                reply = await ws.ask(step)
                t1 = time.perf_counter()
                pending[s] = None
                if window[0] <= t1 <= window[1]:
                    lat[s].append(t1 - t0)
                if not reply.startswith('{"type":"observation"'):
                    if s not in special:
                        errors += 1
                    await ws.ask(reset)
                elif '"done":true' in reply:
                    await ws.ask(reset)
        finally:
            await ws.close()

    # sessions open one at a time (the hanging one first)
    tasks = []
    for s in range(sessions):
        tasks.append(asyncio.create_task(one(s)))
        while ready <= s and not tasks[-1].done():
            await asyncio.sleep(0.001)
    await asyncio.wait_for(opened.wait(), 120)
    await _measure(tasks, lat, pending, window, stop, warmup, seconds)
    # which sessions share the hung env's worker is the server's business (it spreads
    # sessions over workers by cost): only the innocents as a whole are reported here
    row = _summary(lat, set(), seconds, special)
    row["innocent_errors"] = errors
    return row


def _server_window(sessions: int, special: dict[int, str], warmup: float, seconds: float,
                   step_timeout: float, backend: str) -> dict[str, Any]:
    from turnpool.bench.servers import ServerProcess

    server = ServerProcess("turnpool", sessions, cmd=[
        sys.executable, "-m", "turnpool.cli", "serve", "--env", ENV, "--port", "0",
        "--backend", backend, "--workers", "2", "--max-sessions", str(sessions),
        "--step-timeout", str(step_timeout)])
    try:
        client = subprocess.run(
            [sys.executable, "-m", "turnpool.bench.hol", "client", server.url, str(sessions),
             json.dumps(special), str(warmup), str(seconds)],
            capture_output=True, text=True, timeout=warmup + seconds + 600)
        if client.returncode != 0:
            raise RuntimeError(f"load client failed: {client.stderr[-2000:]}")
        row: dict[str, Any] = json.loads(client.stdout.strip().splitlines()[-1])
        return row
    finally:
        server.close()


# ---------------------------------------------------------------------- the benchmark
def run(through: list[str], sessions: int, pairs: int, warmup: float, seconds: float,
        step_timeout: float, compare_no_handoff: bool, progress: ProgressFn,
        slow_factor: float = 0.0, backend: str = "process") -> dict[str, Any]:
    """Alternate the windows on ``backend``; ``slow_factor``: also windows where 1% of the
    envs step that many times slower (busy computing)."""
    slow_ms = step_cost_ms() * slow_factor if slow_factor else 0.0
    windows: list[dict[str, Any]] = []
    plan: list[tuple[str, str]] = []
    for _ in range(pairs):
        for way in through:
            plan += [(way, "uniform"), (way, "hang")]
            if way == "pool" and compare_no_handoff:
                plan.append((way, "hang, no hand-off"))
            if slow_factor:
                plan.append((way, "1% slow"))
    for n, (way, kind) in enumerate(plan):
        progress(f"{way}: {kind} ({n + 1}/{len(plan)})")
        special = special_actions(kind, sessions, slow_ms)
        if way == "pool":
            row = _pool_window(sessions, special, kind != "hang, no hand-off", warmup, seconds,
                               step_timeout, backend)
        else:
            row = _server_window(sessions, special, warmup, seconds, step_timeout, backend)
        row.update(through=way, kind=kind, load_1m=os.getloadavg()[0])
        windows.append(row)
    summary = []
    for way in through:
        base = [w for w in windows if w["through"] == way and w["kind"] == "uniform"]
        for kind in KINDS[1:]:
            rows = [w for w in windows if w["through"] == way and w["kind"] == kind]
            if not rows:
                continue
            ratios = sorted(h["p99_ms"] / b["p99_ms"] for h, b in zip(rows, base)
                            if h["p99_ms"] and b["p99_ms"])
            summary.append({"through": way, "kind": kind,
                            "p99_ratio_median": ratios[len(ratios) // 2] if ratios else None,
                            "p99_ratio_min": ratios[0] if ratios else None,
                            "p99_ratio_max": ratios[-1] if ratios else None,
                            "near_max_ms": max((r["near_max_ms"] for r in rows
                                                if r["near_max_ms"] is not None),
                                               default=None)})
    return {"benchmark": "hol", "machine": machine_info(), "backend": backend,
            "sessions": sessions,
            "step_timeout": step_timeout, "seconds": seconds, "slow_factor": slow_factor,
            "slow_ms": slow_ms, "windows": windows, "summary": summary}


def render(report: dict[str, Any]) -> list[Any]:
    from rich.table import Table

    table = Table(title=f"one hanging env among {report['sessions']} sessions on "
                        f"{report.get('backend', 'process')} "
                        f"(step_timeout {report['step_timeout']:g} s): the innocents")
    for col in ("through", "window", "steps/s", "p50 ms", "p99 ms", "max ms",
                "same worker p99", "same worker max", "errors", "load"):
        table.add_column(col)

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:,.1f}"

    for w in report["windows"]:
        table.add_row(w["through"], w["kind"], f"{w['steps_per_s']:,.0f}", ms(w["p50_ms"]),
                      ms(w["p99_ms"]), ms(w["max_ms"]), ms(w["near_p99_ms"]),
                      ms(w["near_max_ms"]), str(w["innocent_errors"]), f"{w['load_1m']:.1f}")
    summary = Table(title="innocents' p99 in the window / in the uniform one (median, min-max)")
    for col in ("through", "window", "p99 ratio", "same worker max ms"):
        summary.add_column(col)
    for s in report["summary"]:
        rng = ("-" if s["p99_ratio_median"] is None else
               f"{s['p99_ratio_median']:.2f}x ({s['p99_ratio_min']:.2f}-"
               f"{s['p99_ratio_max']:.2f})")
        summary.add_row(s["through"], s["kind"], rng, ms(s["near_max_ms"]))
    return [table, summary]


def _client_main(argv: list[str]) -> None:
    url, sessions, special, warmup, seconds = argv
    actions = {int(k): str(v) for k, v in json.loads(special).items()}
    row = asyncio.run(_drive_server(url, int(sessions), actions, float(warmup),
                                    float(seconds)))
    print(json.dumps(row), flush=True)


@click.command()
@click.option("--through", default="pool,serve", show_default=True,
              help="Comma-separated: pool (the slot engine) and/or serve (turnpool serve).")
@click.option("--backend", default="process", show_default=True,
              type=click.Choice(["process", "process_pool", "joblib", "ray"]),
              help="The backend whose workers hold the sessions' envs.")
@click.option("--sessions", default=256, show_default=True, type=int,
              help="Sessions stepping at once.")
@click.option("--pairs", default=2, show_default=True, type=int,
              help="Uniform/hang window pairs per way, alternated.")
@click.option("--seconds", default=8.0, show_default=True, type=float,
              help="Length of each measured window.")
@click.option("--warmup", default=1.0, show_default=True, type=float,
              help="Seconds run before each window is measured.")
@click.option("--step-timeout", default=5.0, show_default=True, type=float,
              help="The pool's step_timeout (what a hang costs).")
@click.option("--compare-no-handoff", is_flag=True, default=False,
              help="Also run pool windows with the hand-off turned off.")
@click.option("--slow-factor", default=0.0, show_default=True, type=float,
              help="Also run windows where 1% of the envs step this many times slower.")
@json_option("Write the report as JSON here.")
def command(through: str, backend: str, sessions: int, pairs: int, seconds: float,
            warmup: float, step_timeout: float, compare_no_handoff: bool, slow_factor: float,
            json_path: Path | None) -> None:
    """One hanging env: the step latency of the sessions that share its worker."""
    ways = [w.strip() for w in through.split(",") if w.strip()]
    bad = [w for w in ways if w not in ("pool", "serve")]
    if bad or not ways:
        raise click.BadParameter(f"unknown: {bad}; use pool and/or serve", param_hint="--through")
    if sessions < 2:
        raise click.BadParameter("at least 2 sessions", param_hint="--sessions")
    console = start()
    report = measure_and_print(
        console, lambda p: run(ways, sessions, max(1, pairs), warmup, seconds, step_timeout,
                               compare_no_handoff, p, slow_factor, backend), render)
    write_outputs(console, report, json_path)


if __name__ == "__main__":
    if sys.argv[1:2] == ["client"]:
        _client_main(sys.argv[2:])
