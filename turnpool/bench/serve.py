"""``turnpool bench serve``: OpenEnv's reference server and ``turnpool serve``, side by side,
under the same client load.

Both servers run the same Sokoban env class, each in its own process on this machine:
OpenEnv's ``create_app`` over the env wrapped as an OpenEnv ``Environment`` (one env and one
executor thread per session, all in the server process), and ``turnpool serve`` (one env
slot of an `EnvPool` per session, envs in worker processes, the steps of all sessions batched
into pool calls). A client process drives each the same way over the same wire messages
(``/ws``, ``{"type": "step", "data": {"action": "Up"}}``): ``N`` concurrent sessions, each
resets with its own seed, then steps as fast as replies come back (closed loop, no think
time) and resets when its episode ends. Only the measurement window counts (after a warm-up).
The client is aiohttp's WebSocket client by default (``--client``), so a client that is not
turnpool's reads turnpool's frames; ``--client turnpool`` runs turnpool's own codec.

The servers are measured interleaved: every server runs for the whole benchmark, and at each
load level ``--pairs`` rounds each give every server one window, in alternating order (A B, B
A, A B, ...), so a change in the machine's load between windows falls on both. Each window
records the machine's 1-minute load and the share of CPU the servers and the client did not
use (``other_busy``); the report gives, per level, the median and the spread of the per-pair
ratio (turnpool over OpenEnv, steps/s and p99), and the machine's pure-Python speed before and
after the run (`turnpool.bench.harness.python_speed`), against which to read the absolute
CPU µs per step.

Then each server is asked to hold as many sessions as it can, up to ``--hold``: the client
opens them, resets each and steps each once, all kept open; "held" counts the sessions whose
step was answered. RSS is the server process plus its children (the pool's workers), sampled
at the end of each phase. ``--url NAME=URL`` drives a server that is already running (a
user's own OpenEnv server, say) in place of starting NAME; its CPU and RSS are not known.

    turnpool bench serve                           # 64 / 256 / 1024 sessions, hold 4096
    turnpool bench serve --sessions 64 --hold 256 --seconds 3 --json serve.json --plot serve.png
    turnpool bench serve --url openenv=http://127.0.0.1:8001 --hold 0
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
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
from turnpool.bench.servers import (
    ENV,
    SERVERS,
    RunningServer,
    ServerProcess,
    _read_line,
    known_server,
)
from turnpool.bench.ws_client import CLIENTS, DEFAULT_CLIENT, SKETCH

log = logging.getLogger(__name__)



def _client(args: list[str], timeout: float, on_mark: Any = None,
            client: str = DEFAULT_CLIENT) -> dict[str, Any]:
    """Run a load client; ``on_mark("started" | "stopped")`` is called when its sessions
    start and stop stepping."""
    proc = _start_client(args, client)
    try:
        line = _read_line(proc, timeout)
        while line.strip() in ("started", "stopped"):
            if on_mark is not None:
                on_mark(line.strip())
            line = _read_line(proc, timeout)
        if not line.strip():
            raise RuntimeError(f"the load client gave no result within {timeout:.0f} s")
        result: dict[str, Any] = json.loads(line)
        return result
    finally:
        _end_client(proc, "", 60)


def _start_client(args: list[str], client: str = DEFAULT_CLIENT) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "turnpool.bench.ws_client", *args],
                            stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True,
                            env={**os.environ, "TURNPOOL_BENCH_CLIENT": client})


def _end_client(proc: subprocess.Popen[str], last_input: str, timeout: float) -> None:
    """Send ``last_input``, close the client's stdin (its cue to finish) and wait for it;
    kill it if it outlives ``timeout``."""
    if proc.stdin is not None:
        if last_input:
            proc.stdin.write(last_input)
        proc.stdin.close()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


def _hold_on(server: ServerProcess | RunningServer, sessions: int,
             client: str = DEFAULT_CLIENT) -> dict[str, Any]:
    proc = _start_client(["hold", server.url, str(sessions)], client)
    try:
        line = _read_line(proc, 900)
        result: dict[str, Any] = json.loads(line) if line.strip() else \
            {"asked": sessions, "held": 0, "open_s": None}
        result["rss_mb"] = server.rss_mb()
        return result
    finally:
        _end_client(proc, "\n", 120)


# ---------------------------------------------------------------------- the benchmark
def _machine_busy_s() -> float:
    import psutil

    t = psutil.cpu_times()
    return float(t.user + t.system)


def _clients(args: list[str], n: int, clients: int, timeout: float,
             on_mark: Any, client: str = DEFAULT_CLIENT) -> dict[str, Any]:
    """``n`` sessions over ``clients`` load client processes that start together; their
    results summed, latency percentiles from their pooled quantile sketches."""
    shares = [n // clients + (1 if c < n % clients else 0) for c in range(clients)]
    firsts = [sum(shares[:c]) for c in range(clients)]
    procs = [_start_client(["load", args[0], str(share), *args[2:], str(first), "sync"],
                           client)
             for share, first in zip(shares, firsts, strict=True)]
    try:
        for proc in procs:
            if _read_line(proc, timeout).strip() != "ready":
                raise RuntimeError("a load client did not open its sessions")
        on_mark("started")
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for proc in procs:
            while _read_line(proc, timeout).strip() != "stopped":
                pass
        on_mark("stopped")
        parts = [json.loads(_read_line(proc, timeout)) for proc in procs]
    finally:
        for proc in procs:
            _end_client(proc, "", 60)
    out: dict[str, Any] = {k: sum(p[k] for p in parts) for k in (
        "sessions", "running", "steps", "all_steps", "steps_per_s", "errors", "refused",
        "client_cpu_s")}
    pooled = sorted((q, p["steps"] / SKETCH) for p in parts for q in p["quantiles_ms"])
    total = sum(w for _, w in pooled)

    def pct(q: float) -> float | None:
        seen = 0.0
        for value, w in pooled:
            seen += w
            if seen >= q * total:
                return float(value)
        return None

    out.update(think_s=parts[0]["think_s"], p50_ms=pct(0.5), p99_ms=pct(0.99), clients=clients)
    return out


def _window(kind: str, server: ServerProcess | RunningServer, n: int, warmup: float,
            seconds: float, think: float = 0.0, clients: int = 1,
            client: str = DEFAULT_CLIENT) -> dict[str, Any]:
    """One load window on one server, with the machine's state over it: ``other_busy`` is
    the share of all cores busy with neither the server nor the load clients."""
    import psutil

    marks: dict[str, tuple[float | None, float, float]] = {}

    def mark(name: str) -> None:  # server CPU, machine CPU, wall clock
        marks[name] = (server.cpu_s(), _machine_busy_s(), time.monotonic())

    args = [server.url, str(n), str(warmup), str(seconds), str(think)]
    if clients > 1:
        row = _clients(args, n, clients, warmup + seconds + 600, mark, client)
    else:
        row = _client(["load", *args], timeout=warmup + seconds + 600, on_mark=mark,
                      client=client)
    row.pop("quantiles_ms", None)
    cpu = other = None
    if "started" in marks and "stopped" in marks:
        (s0, m0, w0), (s1, m1, w1) = marks["started"], marks["stopped"]
        cpu = s1 - s0 if s0 is not None and s1 is not None else None
        ours = (cpu or 0.0) + float(row.get("client_cpu_s") or 0.0)
        cores = psutil.cpu_count() or 1
        other = max(0.0, (m1 - m0 - ours) / ((w1 - w0) * cores)) if w1 > w0 else None
    row.update(server=kind, rss_mb=server.rss_mb(), server_cpu_s=cpu,
               cpu_us_per_step=cpu / row["all_steps"] * 1e6
               if cpu is not None and row["all_steps"] else None,
               load_1m=os.getloadavg()[0],
               other_busy=other if cpu is not None else None)
    return row


def _median(values: list[float]) -> float | None:
    import statistics

    return statistics.median(values) if values else None


def summarize(rows: list[dict[str, Any]], levels: list[int]) -> list[dict[str, Any]]:
    """Per level: the per-pair ratios turnpool / openenv (steps/s, p99) with median and
    spread, and each server's median steps/s, p99 and CPU per step."""
    out = []
    for n in levels:
        at = [r for r in rows if r["sessions"] == n]
        pairs = sorted({r["pair"] for r in at})
        ratios, p99s = [], []
        for p in pairs:
            by = {r["server"]: r for r in at if r["pair"] == p}
            ref, ours = by.get("openenv"), by.get("turnpool")
            if ref and ours and ref["steps_per_s"]:
                ratios.append(ours["steps_per_s"] / ref["steps_per_s"])
                if ref["p99_ms"] and ours["p99_ms"]:
                    p99s.append(ours["p99_ms"] / ref["p99_ms"])
        entry: dict[str, Any] = {"sessions": n, "pairs": len(pairs),
                                 "x_openenv_median": _median(ratios),
                                 "x_openenv_min": min(ratios) if ratios else None,
                                 "x_openenv_max": max(ratios) if ratios else None,
                                 "p99_ratio_median": _median(p99s)}
        for kind in sorted({r["server"] for r in at}):
            mine = [r for r in at if r["server"] == kind]
            entry[kind] = {
                "x_openenv_median": _median([r["x_openenv"] for r in mine
                                             if r.get("x_openenv") is not None]),
                "steps_per_s": _median([r["steps_per_s"] for r in mine]),
                "p99_ms": _median([r["p99_ms"] for r in mine if r["p99_ms"] is not None]),
                "cpu_us_per_step": _median([r["cpu_us_per_step"] for r in mine
                                            if r.get("cpu_us_per_step") is not None])}
        out.append(entry)
    return out


def run(levels: list[int], hold: int, warmup: float, seconds: float,
        servers: tuple[str, ...], progress: Any = None, pairs: int = 4,
        urls: dict[str, str] | None = None, think: float = 0.0,
        clients: int = 1, client: str = DEFAULT_CLIENT) -> dict[str, Any]:
    urls = dict(urls or {})
    rows: list[dict[str, Any]] = []
    holds: dict[str, dict[str, Any]] = {}
    capacity = max([hold, *levels])
    running: dict[str, ServerProcess | RunningServer] = {}
    speed_before = python_speed()
    try:
        for kind in servers:
            if kind in urls:
                running[kind] = RunningServer(urls[kind])
                continue
            if progress:
                progress(f"{kind}: starting a server for {capacity} sessions")
            running[kind] = ServerProcess(kind, capacity)
        for n in levels:
            for p in range(pairs):
                order = list(running) if p % 2 == 0 else list(reversed(running))
                for kind in order:
                    if progress:
                        progress(f"{n} sessions, pair {p + 1}/{pairs}: {kind}")
                    row = _window(kind, running[kind], n, warmup, seconds, think, clients,
                                  client)
                    row["pair"] = p
                    rows.append(row)
                    log.info("%s %d sessions: %.0f steps/s", kind, n, row["steps_per_s"])
        for n in levels:
            for p in range(pairs):
                by = {r["server"]: r for r in rows if r["sessions"] == n and r["pair"] == p}
                ref = by.get("openenv", {}).get("steps_per_s")
                for r in by.values():
                    r["x_openenv"] = r["steps_per_s"] / ref if ref else None
        if hold:
            for kind, server in running.items():
                if progress:
                    progress(f"{kind}: holding up to {hold} sessions")
                holds[kind] = _hold_on(server, hold, client)
    finally:
        for server in running.values():
            server.close()
    load = os.getloadavg()[0]
    return {"benchmark": "serve", "env": ENV, "levels": levels, "hold": hold,
            "warmup_s": warmup, "seconds": seconds, "pairs": pairs, "think_s": think,
            "clients": clients, "client": client,
            "rows": rows,
            "summary": summarize(rows, levels), "holds": holds,
            "external": sorted(urls),
            "machine": machine_info(loadavg_1m_at_end=load,
                                    python_ns_per_iter=[speed_before, python_speed()])}


def render(report: dict[str, Any]) -> list[Any]:
    from rich.table import Table

    think = report.get("think_s") or 0.0
    pace = f"sessions pausing {think:g} s after each reply" if think else "closed-loop sessions"
    clients = report.get("clients") or 1
    table = Table(title=f"serve: {report['env']}, {pace}, {report['seconds']:g} s window, "
                        f"{report['machine']['cpu_count']} cpus, "
                        f"{report.get('client', DEFAULT_CLIENT)} client"
                        + (f", {clients} client processes" if clients > 1 else ""))
    for col in ("sessions", "pair", "server", "running", "steps/s", "x openenv", "p50 ms",
                "p99 ms", "cpu us/step", "errors", "RSS MB", "load 1m", "other busy"):
        table.add_column(col, justify="left" if col == "server" else "right")

    def ms(v: float | None) -> str:
        return f"{v:.1f}" if v is not None else "-"

    def ratio(v: float | None) -> str:
        return f"{v:.2f}" if v is not None else "-"


    for r in report["rows"]:
        x = r.get("x_openenv")
        other = r.get("other_busy")
        table.add_row(str(r["sessions"]), str(r.get("pair", 0) + 1), r["server"],
                      str(r["running"]), f"{r['steps_per_s']:.0f}", f"{x:.2f}" if x else "-",
                      ms(r["p50_ms"]), ms(r["p99_ms"]), ms(r.get("cpu_us_per_step")),
                      str(r["errors"]), ms(r.get("rss_mb")), ms(r.get("load_1m")),
                      f"{other:.0%}" if other is not None else "-")
    out: list[Any] = [table]
    if report.get("summary"):
        summary = Table(title="per level, over the pairs (interleaved windows)")
        for col in ("sessions", "pairs", "x openenv median", "x openenv min..max",
                    "p99 turnpool/openenv", "turnpool cpu us/step", "openenv cpu us/step"):
            summary.add_column(col, justify="right")
        for e in report["summary"]:
            lo, hi = e.get("x_openenv_min"), e.get("x_openenv_max")
            summary.add_row(str(e["sessions"]), str(e["pairs"]),
                            ratio(e.get("x_openenv_median")),
                            f"{lo:.2f}..{hi:.2f}" if lo is not None and hi is not None else "-",
                            ratio(e.get("p99_ratio_median")),
                            ms((e.get("turnpool") or {}).get("cpu_us_per_step")),
                            ms((e.get("openenv") or {}).get("cpu_us_per_step")))
        out.append(summary)
        extra = sorted({k for e in report["summary"] for k in e
                        if isinstance(e[k], dict) and k not in SERVERS})
        for kind in extra:
            out.append(f"{kind}: " + "; ".join(
                f"{e['sessions']} sessions x openenv {ratio(e[kind].get('x_openenv_median'))}"
                f", {ms(e[kind].get('steps_per_s'))} steps/s, p99 {ms(e[kind].get('p99_ms'))}"
                f" ms, cpu {ms(e[kind].get('cpu_us_per_step'))} us/step"
                for e in report["summary"] if kind in e))
    if report["holds"]:
        held = Table(title=f"sessions held (asked {report['hold']}: open, reset, step, keep)")
        for col in ("server", "held", "seconds to open", "RSS MB"):
            held.add_column(col, justify="left" if col == "server" else "right")
        for kind, h in report["holds"].items():
            held.add_row(kind, str(h["held"]), ms(h.get("open_s")), ms(h.get("rss_mb")))
        out.append(held)
    out.append("running: sessions that reset and stepped; x openenv: steps/s over OpenEnv's "
               "reference server at the same load; cpu us/step: CPU time of the server process "
               "and its workers per step served (reads the same on a busy machine, unlike "
               "steps/s); RSS: server process + its children.")
    speed = speed_text(report["machine"])
    if speed:
        out.append(speed)
    return out


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(14, 4))
    kinds = (*SERVERS, *sorted({k for e in report["summary"] for k in e
                                if isinstance(e[k], dict)}))
    for kind in dict.fromkeys(kinds):  # medians over the pairs; bars: each window's spread
        at = [e for e in report["summary"] if kind in e]
        if not at:
            continue
        xs = [e["sessions"] for e in at]
        for ax, key in ((ax1, "steps_per_s"), (ax2, "p99_ms"), (ax3, "cpu_us_per_step")):
            ys = [e[kind][key] or 0 for e in at]
            line = ax.plot(xs, ys, marker="o", label=kind)[0]
            for e in at:
                vals = [r[key] for r in report["rows"] if r["server"] == kind
                        and r["sessions"] == e["sessions"] and r.get(key) is not None]
                if vals:
                    ax.vlines(e["sessions"], min(vals), max(vals), color=line.get_color(),
                              alpha=0.5)
    for ax, label in ((ax1, "steps/s"), (ax2, "p99 step latency (ms)"),
                      (ax3, "server CPU us per step")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent sessions")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(f"turnpool serve vs OpenEnv's reference server ({report['env']}, "
                 f"{report['machine']['cpu_count']} cpus)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@click.command("serve")
@click.option("--sessions", default="64,256,1024", show_default=True,
              help="Comma list of concurrent-session levels.")
@click.option("--hold", default=4096, show_default=True,
              help="Sessions to try to hold at once (0: skip).")
@click.option("--seconds", default=10.0, show_default=True, help="Measured window per level.")
@click.option("--warmup", default=2.0, show_default=True, help="Unmeasured seconds first.")
@click.option("--servers", default=",".join(SERVERS), show_default=True,
              help="Servers compared, interleaved: openenv, turnpool, turnpool-f<N> "
                   "(turnpool serve --frontends N), turnpool-sequential / -thread / "
                   "-process_pool (its pool on that backend).")
@click.option("--pairs", default=4, show_default=True,
              help="Interleaved rounds per level: each gives every server one window.")
@click.option("--url", "urls", multiple=True, metavar="NAME=URL",
              help="Drive a server already running at URL as NAME (openenv or turnpool) "
                   "instead of starting one; repeatable.")
@click.option("--think", default=0.0, show_default=True, type=float,
              help="Seconds each session waits after each reply (an LLM's pace; 0: back to "
                   "back). Latency is then what the server adds to each step.")
@click.option("--clients", default=1, show_default=True, type=click.IntRange(min=1),
              help="Load client processes sharing the sessions (one Python client tops out "
                   "near 20k steps/s: use several where the server has many cores).")
@click.option("--client", default=DEFAULT_CLIENT, show_default=True,
              type=click.Choice(sorted(CLIENTS)),
              help="The load client's WebSocket library: aiohttp's client (not turnpool's) or "
                   "turnpool's own codec.")
@json_option("Also write the report as JSON here.")
@plot_option("Also save a PNG plot here.")
def command(sessions: str, hold: int, seconds: float, warmup: float, servers: str,
            pairs: int, urls: tuple[str, ...], think: float, clients: int, client: str,
            json_path: Path | None, plot_path: Path | None) -> None:
    """OpenEnv's reference server vs turnpool serve: steps/s, latency, sessions held, RSS."""
    try:
        levels = [int(x) for x in sessions.split(",") if x.strip()]
    except ValueError as exc:
        raise click.BadParameter(f"--sessions must be integers: {exc}") from exc
    chosen = tuple(s.strip() for s in servers.split(",") if s.strip())
    unknown = {s for s in chosen if not known_server(s)}
    if unknown:
        raise click.BadParameter(f"unknown servers {sorted(unknown)}; known: {SERVERS}, "
                                 "turnpool-f<N>, turnpool-<sequential|thread|process_pool>")
    given: dict[str, str] = {}
    for item in urls:
        name, sep, url = item.partition("=")
        if not sep or not known_server(name) or not url.startswith(("http://", "https://")):
            raise click.BadParameter(f"--url takes NAME=URL with NAME one of {SERVERS}, got "
                                     f"{item!r}")
        given[name] = url
    if pairs < 1:
        raise click.BadParameter("--pairs must be >= 1")
    console = start(width=160)
    report = measure_and_print(
        console, lambda progress: run(levels, hold, warmup, seconds, chosen, progress, pairs,
                                      given, think, clients, client), render)
    write_outputs(console, report, json_path, plot_path, plot)

