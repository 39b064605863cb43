"""``turnpool bench sandbox``: runs/s and per-run latency of the sandbox against RAGEN's way.

Two workloads, each measured both ways in one run, interleaved in rounds so that a change in
the machine's load hits both alike:

* ``trivial``: a program that does nothing (``pass``): the latency is the per-run overhead;
* ``deepcoder10``: a correct reply to a DeepCoder problem with 10 stdin/stdout tests, all
  tests in one process (as RAGEN and the deepcoder env batch them).

``sandbox``: `turnpool.sandbox.Sandbox` (namespaces, rlimits, seccomp; warm: forked from the
server's interpreter), one sandbox per client thread. ``subprocess``: RAGEN's way, a temporary
file and ``subprocess.run([python, file], timeout=3)``, no isolation, with the running
interpreter (a training venv's, which scans its site-packages at start); ``bare-subprocess``:
the same with ``python -I -S`` (no site-packages), the fastest any fresh interpreter can be.
``--clients`` threads drive runs at once (default 2: the 2 cores this is aimed at); runs/s
is all runs over the wall time, latency is per run (p50 / p99), and CPU per run is the time of
every process involved (this one, the sandbox servers and the programs, or the subprocesses),
less the sandbox servers' own starts: the figure that the machine's load disturbs least.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import click

from turnpool.cli.options import FirstName
from turnpool.envs.deepcoder import HARNESS, load_problems, run_reply
from turnpool.sandbox import Limits, Sandbox

SUM = "n = int(input())\na = list(map(int, input().split()))\nprint(sum(a) % 7)\n"


def _problem10() -> dict[str, Any]:
    problem = dict(load_problems({})[0])  # "sum modulo 7"
    tests = list(problem["tests"])
    problem["tests"] = (tests * 2)[:10]
    return problem


def _plain_run(files: dict[str, str], main: str, bare: bool = False) -> None:
    """RAGEN's way: files in a temporary directory, ``subprocess.run`` of the interpreter
    (``bare``: with ``-I -S``, no site-packages to scan: the fastest fresh interpreter)."""
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in files.items():
            with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
                f.write(text)
        flags = ["-I", "-S"] if bare else []
        subprocess.run([sys.executable, *flags, main], cwd=tmp, input="", text=True,
                       capture_output=True, timeout=3, check=False)


def _plain_deepcoder(problem: dict[str, Any], bare: bool = False) -> Callable[[], None]:
    case = {"code": SUM, "func_name": None, "mark": "@m@",
            "tests": [{"kind": "stdin", "input": t["input"]} for t in problem["tests"]]}
    files = {"harness.py": HARNESS, "case.json": json.dumps(case)}
    return lambda: _plain_run(files, "harness.py", bare)


def _measure(make_run: Callable[[], Callable[[], None]], runs: int, clients: int
             ) -> tuple[float, list[float]]:
    """(runs/s, latencies) of ``runs`` runs spread over ``clients`` threads."""
    latencies: list[float] = []
    lock = threading.Lock()
    per_client = max(1, runs // clients)

    def client() -> None:
        run = make_run()
        mine = []
        for _ in range(per_client):
            t0 = time.perf_counter()
            run()
            mine.append(time.perf_counter() - t0)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    return len(latencies) / (time.perf_counter() - t0), latencies


def _cpu() -> float:
    """CPU seconds of this process and of every child it (or they) reaped."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _start_cpu() -> float:
    """CPU seconds of one sandbox server's start and close (the least of three)."""
    costs = []
    for _ in range(3):
        before = _cpu()
        with Sandbox() as box:
            box.start()
        costs.append(_cpu() - before)
    return min(costs)


def _q(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] * 1e3


def run_bench(runs: int, clients: int, rounds: int, echo: Callable[[str], None]
              ) -> dict[str, Any]:
    problem = _problem10()
    boxes: list[Sandbox] = []

    def sandboxed(kind: str) -> Callable[[], None]:
        box = Sandbox()
        box.start()
        boxes.append(box)
        if kind == "trivial":
            return lambda: (box.run(["python", "main.py"], files={"main.py": "pass\n"},
                                    limits=Limits(wall=3, cpu=3)), None)[1]
        return lambda: (run_reply(box, SUM, problem), None)[1]

    makers: dict[tuple[str, str], Callable[[], Callable[[], None]]] = {
        ("trivial", "sandbox"): lambda: sandboxed("trivial"),
        ("trivial", "subprocess"): lambda: (lambda: _plain_run({"main.py": "pass\n"},
                                                              "main.py")),
        ("trivial", "bare-subprocess"): lambda: (lambda: _plain_run({"main.py": "pass\n"},
                                                                   "main.py", True)),
        ("deepcoder10", "sandbox"): lambda: sandboxed("deepcoder10"),
        ("deepcoder10", "subprocess"): lambda: _plain_deepcoder(problem),
        ("deepcoder10", "bare-subprocess"): lambda: _plain_deepcoder(problem, True),
    }
    with Sandbox() as box:
        assert run_reply(box, SUM, problem)[0], "the reference reply must pass"
    start_cpu = _start_cpu()
    results: dict[str, dict[str, list[float]]] = {}
    try:
        for r in range(rounds):
            for (work, way), make in makers.items():
                before = _cpu()
                rate, lat = _measure(make, runs, clients)
                for box in boxes:
                    box.close()  # its processes' times count once they are reaped
                cpu = (_cpu() - before - len(boxes) * start_cpu) / max(1, len(lat))
                boxes.clear()
                entry = results.setdefault(f"{work}/{way}", {"rate": [], "lat": [], "cpu": []})
                entry["rate"].append(rate)
                entry["lat"].extend(lat)
                entry["cpu"].append(cpu)
                echo(f"round {r + 1}/{rounds} {work:12s} {way:15s} {rate:7.1f} runs/s "
                     f"{cpu * 1e3:6.2f} cpu ms/run")
    finally:
        for box in boxes:
            box.close()
    summary: dict[str, Any] = {}
    for key, entry in results.items():
        summary[key] = {"runs_per_s": statistics.median(entry["rate"]),
                        "p50_ms": _q(entry["lat"], 0.5), "p99_ms": _q(entry["lat"], 0.99),
                        "cpu_ms": statistics.median(entry["cpu"]) * 1e3}
    for work in ("trivial", "deepcoder10"):
        summary[f"{work}/speedup"] = (summary[f"{work}/sandbox"]["runs_per_s"]
                                      / summary[f"{work}/subprocess"]["runs_per_s"])
        summary[f"{work}/speedup_bare"] = (summary[f"{work}/sandbox"]["runs_per_s"]
                                           / summary[f"{work}/bare-subprocess"]["runs_per_s"])
    return summary


@click.command("sandbox")
@click.option("--runs", default=200, show_default=True, help="runs per window")
@click.option("--clients", default=2, show_default=True, help="threads running at once")
@click.option("--rounds", default=3, show_default=True, help="interleaved rounds")
@click.option("--json", "--json-out", "json_out", cls=FirstName,
              type=click.Path(dir_okay=False),
              default=None, help="Also write the report as JSON here.")
def command(runs: int, clients: int, rounds: int, json_out: str | None) -> None:
    """Sandboxed runs vs RAGEN's subprocess.run: runs/s, p50/p99 latency."""
    summary = run_bench(runs, clients, rounds, lambda s: click.echo(s, err=True))
    click.echo(f"{'workload':14s} {'way':16s} {'runs/s':>8s} {'p50 ms':>8s} {'p99 ms':>8s} "
               f"{'cpu ms':>8s}")
    for work in ("trivial", "deepcoder10"):
        for way in ("sandbox", "subprocess", "bare-subprocess"):
            s = summary[f"{work}/{way}"]
            click.echo(f"{work:14s} {way:16s} {s['runs_per_s']:8.1f} {s['p50_ms']:8.1f} "
                       f"{s['p99_ms']:8.1f} {s['cpu_ms']:8.2f}")
        click.echo(f"{work:14s} sandbox/subprocess runs/s: {summary[f'{work}/speedup']:.2f}x, "
                   f"sandbox/bare-subprocess: {summary[f'{work}/speedup_bare']:.2f}x")
    if json_out:
        with open(json_out, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1)
