"""``turnpool bench soak``: many env-steps with injected faults, checked against a clean run.

The fault model is only worth what it survives at volume, so this benchmark drives a pool of
`SoakEnv` envs for ``--steps`` env-steps (default 100,000) on each backend, injecting a fault
into about ``--fault-rate`` of the env-steps (default 1%), mixed evenly over the kinds the
backend can survive:

* ``raise``: the env raises (every backend) -> ``env_error``;
* ``hang``: the env sleeps in a loop past ``step_timeout`` (every backend) -> ``timeout``;
* ``exit``: the env ends its process with ``os._exit`` -> ``worker_lost`` (process-based
  backends only: on an in-process backend it would end the benchmark itself);
* ``unpicklable``: the env returns an info that cannot be pickled -> ``unpicklable``
  (process-based backends only: nothing is pickled in-process, so it is no fault there).

The same schedule of actions, seeds and faults is first run without faults on the sequential
backend (a faulted env sits out the rest of its episode, so the schedule has enough rounds
for the faulty run to reach ``--steps`` transitions). The report counts, per backend:
transitions requested and returned (lost or duplicated ones are a failure), faults injected
and how each was classified (every fault must carry its class), innocent transitions that
differ from the clean run (must be 0) and hangs (pool calls that took longer than their
faults explain; must be 0). Exit status 1 if any check fails.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click
import numpy as np
from rich.table import Table

from turnpool.bench.harness import ProgressFn, Report, json_option, machine_info, start
from turnpool.envs.synthetic import TrivialEnv
from turnpool.pool import EnvPool

#: fault kind -> the failure class the pool must report
FAULTS = {"raise": "env_error", "hang": "timeout", "exit": "worker_lost",
          "unpicklable": "unpicklable"}
IN_PROCESS = ("sequential", "thread")
ENTRY = f"{__name__}:SoakEnv"
#: a pool call may take this much longer than its hangs and restarts explain
_HANG_SLACK_S = 60.0


class SoakEnv(TrivialEnv):
    """`TrivialEnv` that misbehaves on the actions named in `FAULTS`."""

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if action == "raise":
            raise RuntimeError("soak: injected error")
        if action == "hang":
            while True:  # a Python-level hang (short sleeps: interruptible in any thread)
                time.sleep(0.05)
        if action == "exit":
            os._exit(17)
        obs, reward, terminated, truncated, info = super()._step(action)
        if action == "unpicklable":
            info["callback"] = lambda: None
        return obs, reward, terminated, truncated, info


@dataclass
class SoakSettings:
    """What both soaks (this pool soak and ``bench serve-soak``) set alike: the share of steps
    that misbehave, the pool's worker processes and the seed of the faults' schedule."""

    fault_rate: float = 0.01
    workers: int = 2
    seed: int = 0


@dataclass
class Settings(SoakSettings):
    steps: int = 100_000
    envs: int = 16
    group_n: int = 2
    episode_len: int = 25
    step_timeout: float = 0.5


@dataclass
class BackendResult:
    backend: str
    transitions_requested: int = 0
    transitions_returned: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    classified: dict[str, int] = field(default_factory=dict)
    misclassified: int = 0
    innocent_checked: int = 0
    innocent_mismatches: int = 0
    hangs: int = 0
    max_call_s: float = 0.0
    wall_s: float = 0.0
    actual_backend: str = ""

    @property
    def ok(self) -> bool:
        return (self.transitions_requested == self.transitions_returned
                and self.misclassified == 0 and self.innocent_mismatches == 0
                and self.hangs == 0 and sum(self.faults.values()) == sum(self.classified.values()))


def faults_for(backend: str) -> list[str]:
    """The fault kinds a backend survives."""
    return ["raise", "hang"] if backend in IN_PROCESS else list(FAULTS)


def schedule(s: Settings, kinds: list[str]) -> list[list[tuple[str, str | None]]]:
    """Per pool step, per env: ``(action, fault kind or None)`` (same for every backend
    with the same kinds; the clean run uses the actions only)."""
    rng = np.random.default_rng(s.seed)
    # A faulted env sits out the rest of its episode: schedule enough rounds that the faulty
    # run still reaches ``steps`` transitions (it stops there; the clean run plays them all).
    sitting_out = min(0.8, s.fault_rate * s.episode_len / 2)
    rounds = int(1.2 * s.steps / s.envs / (1 - sitting_out)) + s.episode_len
    plan: list[list[tuple[str, str | None]]] = []
    for r in range(rounds):
        row: list[tuple[str, str | None]] = []
        for i in range(s.envs):
            action = f"a{(r * 7 + i * 3) % 11}"
            fault = None
            if rng.random() < s.fault_rate:
                fault = kinds[int(rng.integers(len(kinds)))]
            row.append((action, fault))
        plan.append(row)
    return plan


def _key(obs: str, reward: float, done: bool, info: dict[str, Any]) -> str:
    return json.dumps([obs, reward, done, info], sort_keys=True, default=repr)


def _drive(pool: EnvPool, s: Settings, plan: list[list[tuple[str, str | None]]],
           faults_on: bool, clean: list[list[str | None]] | None, result: BackendResult
           ) -> list[list[str | None]]:
    """Run the schedule; episodes last ``episode_len`` rounds, then every env is reset. A
    failed env sits out until that reset. Returns the per-round result keys."""
    out: list[list[str | None]] = []
    failed: set[int] = set()
    for r, row in enumerate(plan):
        if faults_on and result.transitions_requested >= s.steps:
            break
        if r % s.episode_len == 0:
            pool.reset(seed=s.seed + (r // s.episode_len) * pool.n_groups)
            failed.clear()
        ids = [i for i in range(s.envs) if i not in failed]
        actions = [row[i][1] if faults_on and row[i][1] else row[i][0] for i in ids]
        injected: dict[int, str] = {}
        for i in ids:
            kind = row[i][1]
            if faults_on and kind is not None:
                injected[i] = kind
        started = time.monotonic()
        obs, rewards, dones, infos = pool.step(actions, env_ids=ids)
        took = time.monotonic() - started
        result.max_call_s = max(result.max_call_s, took)
        slow = sum(kind in ("hang", "exit") for kind in injected.values())
        if took > (slow + 1) * s.step_timeout + _HANG_SLACK_S:
            result.hangs += 1
        result.transitions_requested += len(ids)
        result.transitions_returned += len(obs)
        keys: list[str | None] = [None] * s.envs
        for k, i in enumerate(ids):
            info = infos[k]
            if i in injected:
                kind = injected[i]
                result.faults[kind] = result.faults.get(kind, 0) + 1
                got = info.get("failure")
                if got is not None:
                    result.classified[got] = result.classified.get(got, 0) + 1
                if got != FAULTS[kind] and not (
                        kind == "hang" and got == "worker_lost" and "exit" in injected.values()):
                    # (a hung env whose worker is killed with a sibling that exited, as loky
                    # does, reports the worker's loss: right too)
                    result.misclassified += 1
                elif "error" not in info:
                    result.misclassified += 1
                failed.add(i)
                continue
            key = _key(obs[k], rewards[k], dones[k], info)
            keys[i] = key
            if clean is not None:
                result.innocent_checked += 1
                if clean[r][i] != key:
                    result.innocent_mismatches += 1
            if "error" in info:  # a fault nobody injected: an innocent env was hit
                failed.add(i)
        out.append(keys)
    return out


def run_backend(backend: str, s: Settings, progress: ProgressFn | None = None,
                **pool_options: Any) -> BackendResult:
    """Soak one backend: a clean sequential run of the same schedule, then the faulty run."""
    plan = schedule(s, faults_for(backend))
    n_groups = s.envs // s.group_n
    common: dict[str, Any] = dict(env_num=n_groups, group_n=s.group_n, seed=s.seed,
                  env_kwargs={"episode_len": 10 * s.episode_len})
    if progress:
        progress(f"{backend}: clean reference")
    with EnvPool(ENTRY, backend="sequential", step_timeout=None, **common) as ref:
        clean = _drive(ref, s, plan, False, None, BackendResult("sequential"))
    result = BackendResult(backend)
    if progress:
        progress(f"{backend}: {s.steps:,} env-steps with faults")
    started = time.monotonic()
    with EnvPool(ENTRY, backend=backend, num_workers=s.workers, step_timeout=s.step_timeout,
                 **common, **pool_options) as pool:
        result.actual_backend = pool.backend_name
        _drive(pool, s, plan, True, clean, result)
    result.wall_s = time.monotonic() - started
    return result


def run_benchmark(s: Settings, backends: list[str], progress: ProgressFn) -> Report:
    results = [run_backend(b, s, progress) for b in backends]
    return {"benchmark": "soak", "machine": machine_info(), "settings": asdict(s),
            "results": [{**asdict(r), "ok": r.ok} for r in results]}


def render(report: Report) -> list[Any]:
    s = report["settings"]
    table = Table(title=f"soak: {s['steps']:,} env-steps, {100 * s['fault_rate']:g}% faults, "
                        f"step_timeout {s['step_timeout']:g} s")
    for col in ("backend", "transitions", "lost", "faults injected", "classified as",
                "misclassified", "innocent checked", "innocent differ", "hangs",
                "max call s", "wall s", "ok"):
        table.add_column(col, justify="left" if col in ("backend", "faults injected",
                                                        "classified as") else "right")
    for r in report["results"]:
        table.add_row(
            r["actual_backend"] or r["backend"], f"{r['transitions_returned']:,}",
            f"{r['transitions_requested'] - r['transitions_returned']}",
            ", ".join(f"{k} {v}" for k, v in sorted(r["faults"].items())),
            ", ".join(f"{k} {v}" for k, v in sorted(r["classified"].items())),
            str(r["misclassified"]), f"{r['innocent_checked']:,}",
            str(r["innocent_mismatches"]), str(r["hangs"]), f"{r['max_call_s']:.2f}",
            f"{r['wall_s']:.1f}", "yes" if r["ok"] else "NO")
    return [table]


@click.command(name="soak")
@json_option("Write the report (per-backend counts) as JSON.")
@click.option("--steps", type=click.IntRange(min=1), default=Settings.steps, show_default=True,
              help="Env-steps per backend.")
@click.option("--fault-rate", type=click.FloatRange(0.0, 1.0), default=Settings.fault_rate,
              show_default=True, help="Share of env-steps that get a fault.")
@click.option("--backends", default="process,thread,joblib,ray", show_default=True,
              help="Comma-separated backends to soak.")
@click.option("--step-timeout", type=click.FloatRange(min=0.01), default=Settings.step_timeout,
              show_default=True, help="The pool's step_timeout (what a hang costs).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of the faults' schedule.")
def command(json_path: Path | None, steps: int, fault_rate: float, backends: str,
            step_timeout: float, seed: int) -> None:
    """Faults at volume: 0 hangs, 0 lost transitions, every fault classified, innocent envs
    identical to a clean run."""
    from turnpool.bench.harness import measure_and_print, write_outputs

    console = start(width=160)
    s = Settings(steps=steps, fault_rate=fault_rate, step_timeout=step_timeout, seed=seed)
    names = [b.strip() for b in backends.split(",") if b.strip()]
    report = measure_and_print(console, lambda p: run_benchmark(s, names, p), render)
    write_outputs(console, report, json_path)
    bad = [r["backend"] for r in report["results"] if not r["ok"]]
    if bad:
        raise click.ClickException(f"soak checks failed on: {', '.join(bad)}")
    totals: Counter[str] = Counter()
    for r in report["results"]:
        totals.update(r["faults"])
    console.print(f"all checks passed; faults injected: {dict(sorted(totals.items()))}")


__all__ = ["FAULTS", "SoakEnv", "command", "run_backend", "schedule"]
