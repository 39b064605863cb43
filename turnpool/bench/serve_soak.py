"""``turnpool bench serve-soak``: ``turnpool serve`` under a long load with injected faults.

A server (``turnpool serve --env faulty --backend process --workers 2``) runs in a child
process and a load client (`turnpool.bench.soak_client`) in another. The client holds
``--sessions`` WebSocket sessions; each resets with its own seed, then, every ``--think``
seconds (the sessions' phases spread evenly over the think time), steps with a normal action
or, with probability ``--fault-rate`` (drawn from the session's own ``random.Random``), with a
fault chosen evenly among ``raise``, ``hang`` and ``exit``. A normal step must be answered with
an observation; a faulted one with an error reply that names the fault's failure class
(``raise``: ``env_error``, ``hang``: ``timeout``, ``exit``: ``worker_lost``). After an error or
the end of an episode the session resets. Every ``--reconnect-every`` seconds 1% of the
sessions close their connection and open a new session (churn).

A session is **lost** when a reply does not come within ``step_timeout + 30`` s or the server
closes its connection; the client then opens a new session in its place, so the load stays the
same. Every ``--sample-every`` seconds the benchmark records the server's RSS (server process
plus the pool's workers), the sessions open, steps, faults, replies of each kind, and the p50 /
p99 latency of the interval's normal steps; one line per sample goes to stderr. RSS growth is
measured after ``--warmup`` (set it past one episode length, ``50 x --think`` s: until then the
replay log is still filling) from a least-squares line through every sample since: (its value
at the last sample - at the first) / at the first. Single samples swing (by +-20% at 4,096
sessions): a sample can land while an ``exit`` fault's replacement worker is refilling its
envs, or before a new standby has started, so two samples, or two short windows, measure
that swing rather than a trend. The first/last figure, the medians of the first and last
`WINDOW` samples and the server process's own RSS (one process for the whole run) are
reported beside it. The goal: no RSS growth beyond 5%, no lost session, every fault
classified. ``--faults`` narrows the kinds injected (``raise,hang`` leaves the worker
restarts out).

    turnpool bench serve-soak                                   # 4,096 sessions, 30 minutes
    turnpool bench serve-soak --sessions 256 --think 1 --minutes 2 --json soak.json
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections import Counter, deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import click

from turnpool.bench.harness import (
    ProgressFn,
    Report,
    json_option,
    machine_info,
    measure_and_print,
    start,
    write_outputs,
)
from turnpool.bench.servers import ServerProcess, _read_line
from turnpool.bench.soak import SoakSettings
from turnpool.cli.options import FirstName

#: fault action -> the failure class its error reply names when nothing else happens to it
FAULTS = {"raise": "env_error", "hang": "timeout", "exit": "worker_lost"}
#: fault action -> every class that is right for it: a hung env whose worker another env's
#: ``exit`` kills before its deadline is sent again once, and if that worker dies too it is
#: ``worker_lost`` (its worker died under it), not ``timeout``
ACCEPTED = {"raise": {"env_error"}, "hang": {"timeout", "worker_lost"},
            "exit": {"worker_lost"}}
#: a reply later than step_timeout + this is a lost session
LOST_SLACK_S = 30.0
#: RSS growth the goal allows
RSS_GOAL = 0.05
#: samples whose median is the RSS at the start / the end of the measured span
WINDOW = 5


@dataclass
class Settings(SoakSettings):
    sessions: int = 4096
    think: float = 5.0
    reconnect_every: float = 60.0
    seconds: float = 1800.0
    sample_every: float = 30.0
    warmup: float = 300.0
    step_timeout: float = 5.0
    connect_parallel: int = 64
    faults: tuple[str, ...] = tuple(sorted(FAULTS))

    @property
    def max_sessions(self) -> int:
        """Slots: the sessions plus room for churn (a closed session frees its slot only
        once the server has seen the close)."""
        return self.sessions + max(16, math.ceil(0.02 * self.sessions))

    @property
    def reply_bound(self) -> float:
        return self.step_timeout + LOST_SLACK_S


# ---------------------------------------------------------------------- the server
class SoakServer(ServerProcess):
    """``turnpool serve --env faulty`` in a child process, its stderr kept in a file."""

    def __init__(self, s: Settings, timeout: float = 300.0) -> None:  # noqa: D107
        self.log: IO[str] = tempfile.TemporaryFile("w+", encoding="utf-8")
        self.log_kinds: Counter[str] = Counter()
        cmd = [sys.executable, "-m", "turnpool.cli", "serve", "--env", "faulty",
               "--backend", "process", "--workers", str(s.workers),
               "--max-sessions", str(s.max_sessions), "--step-timeout", str(s.step_timeout),
               "--host", "127.0.0.1", "--port", "0"]
        try:
            super().__init__("turnpool", s.max_sessions, timeout, cmd=cmd, stderr=self.log)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; log: {self.log_tail(20)}") from exc

    def main_rss_mb(self) -> float:
        """Resident memory of the server process alone (its workers are replaced whenever
        one dies, so their share comes and goes)."""
        import psutil

        try:
            return float(psutil.Process(self.proc.pid).memory_info().rss) / 2**20
        except psutil.Error:
            return 0.0

    def log_tail(self, n: int = 40) -> list[str]:
        """The last ``n`` lines the server wrote to stderr (`log_kinds` counts them all, by
        their text with numbers replaced by N)."""
        self.log.flush()
        self.log.seek(0)
        tail: deque[str] = deque(maxlen=n)
        self.log_kinds = Counter()
        for line in self.log:
            tail.append(line.rstrip("\n"))
            self.log_kinds[re.sub(r"\d+", "N", line.strip())[:120]] += 1
        self.log.seek(0, os.SEEK_END)
        return list(tail)


# ---------------------------------------------------------------------- the benchmark
def _sample_line(x: dict[str, Any]) -> str:
    def ms(v: float | None) -> str:
        return f"{v:.0f}" if v is not None else "-"

    return (f"soak t={x['t_s']:.0f}s rss={x['rss_mb']:.0f}MB "
            f"(server {x['main_rss_mb']:.0f}MB) open={x['sessions_open']} "
            f"steps={x['steps']} faults={sum(x['faults'].values())} "
            f"misclassified={x['misclassified']} lost={x['lost']} "
            f"unexpected={sum(x['unexpected_errors'].values())} p50={ms(x['p50_ms'])}ms "
            f"p99={ms(x['p99_ms'])}ms load={x['load_1m']:.1f}")


def run(s: Settings, progress: ProgressFn | None = None) -> Report:
    """The soak: start the server and the client, collect a sample per interval (the
    server's RSS added), and the totals."""
    samples: list[dict[str, Any]] = []
    result: dict[str, Any] = {}
    started: dict[str, Any] = {}
    if progress:
        progress(f"starting a faulty-env server for {s.sessions} sessions")
    server = SoakServer(s)
    log_tail: list[str] = []
    try:
        rss_idle = server.rss_mb()
        if progress:
            progress(f"opening {s.sessions} sessions")
        cmd = [sys.executable, "-m", "turnpool.bench.soak_client", server.url,
               json.dumps(asdict(s))]
        client = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        try:
            wait = 660.0
            while True:
                line = _read_line(client, wait).strip()
                if not line:
                    break
                if line.startswith("{"):
                    started = json.loads(line)
                    wait = s.sample_every + s.reply_bound + 120
                    if progress:
                        progress(f"{started['started']} sessions open; soaking "
                                 f"{s.seconds:g} s")
                elif line.startswith("sample "):
                    x = json.loads(line[7:])
                    x.update(rss_mb=server.rss_mb(), main_rss_mb=server.main_rss_mb(),
                             server_cpu_s=server.cpu_s(),
                             load_1m=os.getloadavg()[0])
                    samples.append(x)
                    print(_sample_line(x), file=sys.stderr, flush=True)
                elif line.startswith("result "):
                    result = json.loads(line[7:])
                    break
        finally:
            if client.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    client.wait(timeout=60)
            if client.poll() is None:
                client.kill()
                client.wait(timeout=30)
        log_tail = server.log_tail(40)
    finally:
        server.close()
    return summarize(s, samples, result, started, rss_idle, log_tail, server.log_kinds)


def fitted_growth(points: list[tuple[float, float]]) -> float | None:
    """Growth along the least-squares line through ``(t, value)`` points, from the first
    point's time to the last's, relative to the line's value at the first (None: fewer than
    two times)."""
    if len({t for t, _ in points}) < 2:
        return None
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    slope = sum((t - mt) * (v - mv) for t, v in points) / sum((t - mt) ** 2 for t, _ in points)
    t0, t1 = points[0][0], points[-1][0]
    start = mv + slope * (t0 - mt)
    return slope * (t1 - t0) / start if start > 0 else None


def summarize(s: Settings, samples: list[dict[str, Any]], result: dict[str, Any],
              started: dict[str, Any], rss_idle: float, log_tail: list[str],
              log_kinds: Counter[str]) -> Report:
    after = [x for x in samples if x["t_s"] >= s.warmup - 1e-6] or samples
    first = after[0]["rss_mb"] if after else None
    last = after[-1]["rss_mb"] if after else None
    growth = (last - first) / first if first and last is not None else None
    main_first = after[0]["main_rss_mb"] if after else None
    main_last = after[-1]["main_rss_mb"] if after else None
    main_growth = (main_last - main_first) / main_first \
        if main_first and main_last is not None else None
    window = min(WINDOW, max(1, len(after) // 2))
    start_med = statistics.median(x["rss_mb"] for x in after[:window]) if after else None
    end_med = statistics.median(x["rss_mb"] for x in after[-window:]) if after else None
    window_growth = (end_med - start_med) / start_med \
        if start_med and end_med is not None else None
    trend = fitted_growth([(x["t_s"], x["rss_mb"]) for x in after])
    server_trend = fitted_growth([(x["t_s"], x["main_rss_mb"]) for x in after])
    faults = sum((result.get("faults") or {}).values())
    lost = result.get("lost")
    complete = bool(result) and len(samples) > 0
    checks = {
        "complete": complete,
        "rss_growth_within_5pct": trend is not None and trend <= RSS_GOAL,
        "no_lost_session": complete and lost == 0,
        "faults_all_classified": complete and result.get("misclassified") == 0,
        "normal_steps_all_answered": complete and not result.get("unexpected_errors"),
    }
    return {"benchmark": "serve-soak", "settings": {**asdict(s), "max_sessions": s.max_sessions,
                                                    "reply_bound_s": s.reply_bound},
            "started": started, "samples": samples, "totals": result,
            "faults_injected": faults,
            "rss": {"idle_mb": rss_idle, "first_mb": first, "last_mb": last,
                    "first_t_s": after[0]["t_s"] if after else None, "growth": growth,
                    "window": window, "start_median_mb": start_med,
                    "end_median_mb": end_med, "window_growth": window_growth,
                    "trend": trend, "server_trend": server_trend,
                    "max_mb": max((x["rss_mb"] for x in samples), default=None),
                    "server_first_mb": main_first, "server_last_mb": main_last,
                    "server_growth": main_growth},
            "checks": checks, "ok": all(checks.values()),
            "server_log": dict(log_kinds.most_common(20)), "server_log_tail": log_tail,
            "machine": machine_info(loadavg_1m_at_end=os.getloadavg()[0])}


def render(report: Report) -> list[Any]:
    from rich.table import Table

    s = report["settings"]
    table = Table(title=f"serve-soak: {s['sessions']:,} sessions, think {s['think']:g} s, "
                        f"{100 * s['fault_rate']:g}% faults, step_timeout "
                        f"{s['step_timeout']:g} s, {report['machine']['cpu_count']} cpus")
    for col in ("t s", "RSS MB", "server MB", "open", "steps", "faults", "misclass.", "lost",
                "unexpected", "reconnects", "p50 ms", "p99 ms", "load 1m"):
        table.add_column(col, justify="right")

    def ms(v: float | None) -> str:
        return f"{v:.1f}" if v is not None else "-"

    for x in report["samples"]:
        table.add_row(f"{x['t_s']:.0f}", f"{x['rss_mb']:.0f}", f"{x['main_rss_mb']:.0f}",
                      str(x["sessions_open"]),
                      f"{x['steps']:,}", str(sum(x["faults"].values())),
                      str(x["misclassified"]), str(x["lost"]),
                      str(sum(x["unexpected_errors"].values())), str(x["reconnects"]),
                      ms(x["p50_ms"]), ms(x["p99_ms"]), f"{x['load_1m']:.1f}")
    t = report["totals"]
    r = report["rss"]

    def pct(v: float | None) -> str:
        return f"{100 * v:+.1f}%" if v is not None else "-"

    lines = [
        table,
        f"steps {t.get('steps', 0):,} (normal {t.get('normal_steps', 0):,}), "
        f"p50 {ms(t.get('p50_ms'))} ms, p99 {ms(t.get('p99_ms'))} ms, "
        f"max {ms(t.get('max_ms'))} ms",
        f"faults injected {report['faults_injected']:,}: "
        + ", ".join(f"{k} {v}" for k, v in sorted((t.get("classified") or {}).items()))
        + f"; misclassified {t.get('misclassified')}",
        f"lost sessions {t.get('lost')} {t.get('lost_by') or ''}; normal steps answered "
        f"with an error: {t.get('unexpected_errors') or 0}; reset errors "
        f"{t.get('reset_errors')}; reconnects {t.get('reconnects')}",
        f"RSS (server + workers) from {r['first_t_s']} s: growth along the fitted line "
        f"{pct(r.get('trend'))} (goal <= {100 * RSS_GOAL:g}%); first/last sample "
        f"{ms(r['first_mb'])} -> {ms(r['last_mb'])} MB ({pct(r['growth'])}); median of the "
        f"first/last {r.get('window')} samples {ms(r.get('start_median_mb'))} -> "
        f"{ms(r.get('end_median_mb'))} MB ({pct(r.get('window_growth'))}); idle "
        f"{ms(r['idle_mb'])} MB; server process alone {ms(r['server_first_mb'])} -> "
        f"{ms(r['server_last_mb'])} MB (fitted {pct(r.get('server_trend'))})",
        "checks: " + ", ".join(f"{k} {'yes' if v else 'NO'}"
                               for k, v in report["checks"].items()),
    ]
    if report["server_log"]:
        lines.append("server log: " + "; ".join(f"{n} x {text}" for text, n
                                                in report["server_log"].items()))
    return lines


@click.command("serve-soak")
@click.option("--sessions", default=Settings.sessions, show_default=True,
              type=click.IntRange(min=1), help="WebSocket sessions held.")
@click.option("--think", default=Settings.think, show_default=True,
              type=click.FloatRange(min=0.0), help="Seconds each session waits between steps.")
@click.option("--fault-rate", default=Settings.fault_rate, show_default=True,
              type=click.FloatRange(0.0, 1.0), help="Share of steps that inject a fault.")
@click.option("--reconnect-every", default=Settings.reconnect_every, show_default=True,
              type=click.FloatRange(min=0.0),
              help="Every this many seconds 1% of sessions reconnect (0: never).")
@click.option("--minutes", default=Settings.seconds / 60, show_default=True,
              type=click.FloatRange(min=0.01), help="How long the soak runs.")
@click.option("--sample-every", default=Settings.sample_every, show_default=True,
              type=click.FloatRange(min=0.5), help="Seconds between samples.")
@click.option("--warmup", default=Settings.warmup, show_default=True,
              type=click.FloatRange(min=0.0),
              help="RSS growth is measured from the first sample at or after this.")
@click.option("--step-timeout", default=Settings.step_timeout, show_default=True,
              type=click.FloatRange(min=0.1), help="The server's step_timeout.")
@click.option("--workers", "--num-workers", "workers", cls=FirstName,
              default=Settings.workers, show_default=True,
              type=click.IntRange(min=1), help="The server's pool workers.")
@click.option("--faults", default=",".join(sorted(FAULTS)), show_default=True,
              help="Comma list of the fault actions injected, chosen evenly.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0),
              help="Seed of the faults' schedule.")
@json_option("Also write the report (samples, totals, checks) as JSON here.")
def command(sessions: int, think: float, fault_rate: float, reconnect_every: float,
            minutes: float, sample_every: float, warmup: float, step_timeout: float,
            workers: int, faults: str, seed: int, json_path: Path | None) -> None:
    """turnpool serve for a long time with faults: RSS growth, lost sessions, latency."""
    kinds = tuple(sorted({k.strip() for k in faults.split(",") if k.strip()}))
    if not kinds or set(kinds) - set(FAULTS):
        raise click.BadParameter(f"--faults takes names among {sorted(FAULTS)}, got {faults!r}")
    s = Settings(sessions=sessions, think=think, fault_rate=fault_rate,
                 reconnect_every=reconnect_every, seconds=minutes * 60,
                 sample_every=sample_every, warmup=warmup, step_timeout=step_timeout,
                 workers=workers, seed=seed, faults=kinds)
    console = start(width=160)
    report = measure_and_print(console, lambda p: run(s, p), render)
    write_outputs(console, report, json_path)
    if not report["ok"]:
        failed = [k for k, v in report["checks"].items() if not v]
        raise click.ClickException(f"soak checks failed: {', '.join(failed)}")
