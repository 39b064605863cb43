"""``turnpool bench rollout``: lock-step vs async collection, wall time measured in one run.

Lock-step collection costs L + E per turn (generation, then env steps); async collection
(`turnpool.rollout.async_driver`) overlaps them and should approach max(L, E). Overlap needs two
resources that would otherwise idle in turn: env work that runs in worker processes or
threads while the policy waits, and enough envs that some are always ready for each side.
Both cases below are throughput-bound on both sides, the regime the async mode is for.

(a) ``scripted``: `SleepPolicy` (the random policy's replies after a sleep standing in for a
    saturated LLM server: ``per_request_s`` per conversation, one call at a time) against the
    ``cpu`` env (pure-Python work per step) on the process backend, one worker per core. E is
    calibrated first; L is then set to ``ratio * E`` for ratio in 0.5, 1, 2.
    ``scripted_parallel`` is the other extreme, a server with spare capacity: every call
    sleeps L whatever its size, calls in parallel. There each env's own chain (its reply,
    then its micro-batch's step) bounds the gain: wall >= turns * (L + its step), so the
    ratio stays above 1 + max_batch * workers / envs at L = E.
(b) ``openai``: the ``openai`` policy against ``transformers serve --continuous-batching`` on
    127.0.0.1 with the tiny model built offline (`turnpool.policies.tiny_llm`), and the
    ``sleep`` env on two env threads (an env service with two lanes, which uses no CPU the
    server needs).
    L is measured with the server; the env latency is then set to ``ratio * L``.

For each row: total L and total E are lock-step's ``timing/policy_s`` and ``timing/env_s``;
the goal is ``async wall <= 1.1 * max(L, E)``. Both modes run the same seeds, and the bench
checks that their trajectories are identical (the model is greedy; a server may still break a
near-tie differently between batch compositions, which the ``identical`` column shows).

    turnpool bench rollout --json rollout.json --plot rollout.png
    turnpool bench rollout --quick --no-openai          # smoke run, seconds
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import click

from turnpool.bench.harness import (
    json_option,
    machine_info,
    measure_and_print,
    plot_option,
    start,
    write_outputs,
)
from turnpool.policies.base import Message, Policy, PolicyStats, TurnContext
from turnpool.rollout.collector import TrajectoryCollector
from turnpool.rollout.settings import (
    AsyncSettings,
    CollectorMode,
    CollectorSettings,
    TagSpec,
    TurnSettings,
)

log = logging.getLogger(__name__)

RATIOS = (0.5, 1.0, 2.0)
GOAL = 1.1
#: Sokoban's instruction: the tiny model was fine-tuned on such prompts, so it answers in
#: format and every turn really steps its env.
_OPENAI_INSTRUCTION = (
    "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to "
    "targets. When you are right next to a box, you can push it by moving in the same "
    "direction. The answer should be a sequence of actions, like "
    "<answer>Right || Right || Up</answer>")


class SleepPolicy:
    """A deterministic stand-in for an LLM: ``inner``'s replies, after sleeping
    ``per_call_s + per_request_s * len(batch)``.

    With ``serial`` (the default) calls take turns, like one saturated accelerator: the total
    policy time is the same however the conversations are split into calls. Without it every
    call sleeps independently, like a server with spare capacity.
    """

    def __init__(self, inner: Policy, per_request_s: float = 0.0, per_call_s: float = 0.0,
                 serial: bool = True) -> None:
        self.inner = inner
        self.per_request_s = float(per_request_s)
        self.per_call_s = float(per_call_s)
        self.serial = serial
        self.stats = PolicyStats()
        self._lock = threading.Lock()

    def generate(self, batch: list[list[Message]],
                 contexts: list[TurnContext] | None = None) -> list[str]:
        cost = self.per_call_s + self.per_request_s * len(batch)
        with self._lock if self.serial else contextlib.nullcontext():
            if cost > 0:
                time.sleep(cost)  # the modelled generation time
            self.stats.calls += 1
            self.stats.requests += len(batch)
            self.stats.generate_seconds += cost
        return self.inner.generate(batch, contexts)

    def close(self) -> None:
        self.inner.close()


@dataclass
class Settings:
    """Sizes of both cases (``quick`` shrinks them to a smoke run)."""

    ratios: tuple[float, ...] = RATIOS
    envs: int = 64
    turns: int = 10
    step_ms: float = 2.0
    workers: int | None = None
    max_batch: int | None = None
    policy_workers: int = 8
    repeats: int = 1
    parallel: bool = True
    scripted: bool = True
    openai: bool = True
    openai_envs: int = 16
    openai_turns: int = 4
    openai_max_tokens: int = 48
    openai_context_window: int = 2
    openai_repeats: int = 2
    quick: bool = False


@dataclass
class ModeRun:
    """One collector mode's fastest run: its wall time, the policy's and the envs' busy time
    in it, how much of the shorter of those two hid behind the other, and its turns."""

    wall_s: float = 0.0
    policy_s: float = 0.0
    env_s: float = 0.0
    overlap_ratio: float = 0.0
    calls: int = 0

    @classmethod
    def of(cls, m: dict[str, float]) -> ModeRun:
        """From a batch's ``timing/...`` metrics."""
        return cls(m["timing/wall_s"], m["timing/policy_s"], m["timing/env_s"],
                   m["timing/overlap_ratio"], int(m["timing/turns"]))


@dataclass
class Row:
    """One (case, ratio): lock-step and async measured on the same pool and seeds."""

    case: str
    ratio_target: float
    envs: int
    turns: int
    ratio_measured: float = 0.0
    lockstep: ModeRun = field(default_factory=ModeRun)
    asynchronous: ModeRun = field(default_factory=ModeRun)
    speedup: float = 0.0
    async_over_max: float = 0.0
    lock_over_sum: float = 0.0
    met: bool = False
    identical: bool = False
    valid_action_ratio: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------ measuring
def _collect(collector: TrajectoryCollector, seed: int) -> tuple[dict[str, float], str]:
    batch = collector.collect(seed=seed)
    buf = io.StringIO()
    batch.to_jsonl(buf)
    return batch.metrics, buf.getvalue()


def _compare(pool: Any, policy: Policy, tags: list[TagSpec], base: CollectorSettings,
             row: Row, seed: int, repeats: int = 1) -> Row:
    """Lock-step and async alternately on the same pool, policy and seed; the fastest run
    of each mode is kept (the others are in ``extra``)."""
    runs: dict[CollectorMode, list[tuple[dict[str, float], str]]] = {"lockstep": [],
                                                                       "async": []}
    for _ in range(max(1, repeats)):
        for mode, out in runs.items():
            col = TrajectoryCollector(pool, policy, tags, replace(base, collector_mode=mode))
            out.append(_collect(col, seed))
    m_lock, text_lock = min(runs["lockstep"], key=lambda r: r[0]["timing/wall_s"])
    m_async, text_async = min(runs["async"], key=lambda r: r[0]["timing/wall_s"])
    row.extra["walls"] = {mode: [m["timing/wall_s"] for m, _ in out]
                          for mode, out in runs.items()}
    lock = row.lockstep = ModeRun.of(m_lock)
    row.asynchronous = ModeRun.of(m_async)
    row.ratio_measured = lock.policy_s / lock.env_s if lock.env_s else 0.0
    row.speedup = lock.wall_s / row.asynchronous.wall_s if row.asynchronous.wall_s else 0.0
    bound = max(lock.policy_s, lock.env_s)
    row.async_over_max = row.asynchronous.wall_s / bound if bound else 0.0
    total = lock.policy_s + lock.env_s
    row.lock_over_sum = lock.wall_s / total if total else 0.0
    row.met = row.async_over_max <= GOAL
    row.identical = all(text == text_lock for out in runs.values() for _, text in out)
    ratios = [v for k, v in m_lock.items() if k.endswith("/valid_action_ratio")]
    row.valid_action_ratio = sum(ratios) / len(ratios) if ratios else 0.0
    return row


def _cpu_iters_per_ms() -> float:
    """Iterations of the ``cpu`` env's loop per millisecond in this process."""
    from turnpool.envs.synthetic import CpuEnv

    env = CpuEnv(work_iters=20_000)
    env.reset(seed=0)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        env.step("x")
        best = min(best, time.perf_counter() - t0)
    return 20_000 / (best * 1000.0)


def _turn_settings(max_turn: int, policy_workers: int, max_batch: int | None,
                   window: int = -1) -> CollectorSettings:
    return CollectorSettings(
        max_turn=max_turn, turn=TurnSettings(max_actions_per_turn=1, enable_think=False,
                                             max_context_window=window),
        async_settings=AsyncSettings(max_batch=max_batch, policy_workers=policy_workers))


def run_scripted(settings: Settings, progress: Callable[[str], None]) -> list[Row]:
    """Case (a): sleeping scripted policy vs CPU-bound env on the process backend."""
    from turnpool.policies.random import RandomPolicy
    from turnpool.pool import EnvPool

    iters = max(1, int(settings.step_ms * _cpu_iters_per_ms()))
    kwargs = {"work_iters": iters, "episode_len": 10**9}
    tag = TagSpec("cpu", "cpu", n_groups=settings.envs, env_kwargs=kwargs,
                  max_actions_per_traj=10**6)
    base = _turn_settings(settings.turns, settings.policy_workers, settings.max_batch)
    rows: list[Row] = []
    with EnvPool("cpu", env_num=settings.envs, group_n=1, seed=0, env_kwargs=kwargs,
                 backend="process", num_workers=settings.workers, tag="cpu",
                 step_timeout=600.0) as pool:
        progress("scripted: calibrating E")
        calib = SleepPolicy(RandomPolicy(seed=0, max_actions=1))
        lock = TrajectoryCollector(pool, calib, [tag], base)
        _collect(lock, seed=0)  # warm-up
        metrics, _ = _collect(lock, seed=0)
        e_turn = metrics["timing/env_s"] / max(1.0, metrics["timing/turns"])
        models = ("serial", "parallel") if settings.parallel else ("serial",)
        for model in models:
            case = "scripted" if model == "serial" else "scripted_parallel"
            for ratio in settings.ratios:
                progress(f"{case}: L/E = {ratio:g}")
                inner = RandomPolicy(seed=0, max_actions=1)
                if model == "serial":
                    policy = SleepPolicy(inner, per_request_s=ratio * e_turn / settings.envs)
                else:
                    policy = SleepPolicy(inner, per_call_s=ratio * e_turn, serial=False)
                row = Row(case, ratio, settings.envs, settings.turns)
                rows.append(_compare(pool, policy, [tag], base, row, seed=1,
                                     repeats=settings.repeats))
                row.extra |= {"policy_model": model, "step_ms": settings.step_ms,
                              "work_iters": iters, "backend": pool.backend_name,
                              "workers": pool.num_workers, "e_turn_calibrated_s": e_turn,
                              "per_request_s": policy.per_request_s,
                              "per_call_s": policy.per_call_s}
    return rows


@contextlib.contextmanager
def _served_tiny_model(progress: Callable[[str], None]) -> Iterator[str]:
    from turnpool.policies.tiny_llm import build_tiny_model, transformers_server

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="turnpool-bench-") as tmp:
        progress("openai: building the tiny model")
        model = build_tiny_model(Path(tmp) / "tiny", sft_steps=150, seed=0)
        progress("openai: starting transformers serve --continuous-batching")
        with transformers_server(model, extra_args=("--continuous-batching",)) as url:
            yield url


def run_openai(settings: Settings, progress: Callable[[str], None]) -> list[Row]:
    """Case (b): the openai policy against transformers serve, env latency on two lanes."""
    from turnpool.policies.openai import OpenAIPolicy
    from turnpool.pool import EnvPool

    n = settings.openai_envs
    rows: list[Row] = []
    with _served_tiny_model(progress) as url:
        policy = OpenAIPolicy(base_url=url, max_tokens=settings.openai_max_tokens,
                              temperature=0.0, concurrency=n, timeout=120.0)
        # a bounded history keeps L per turn steady; micro-batches of n/4 from n/4 threads
        base = _turn_settings(settings.openai_turns, max(1, n // 4), max(1, n // 4),
                              settings.openai_context_window)
        try:
            progress("openai: warming up and measuring L")
            tag = TagSpec("serve", "sleep", n_groups=n, env_kwargs={"sleep_ms": 0.0},
                          max_actions_per_traj=10**6, env_instruction=_OPENAI_INSTRUCTION)
            with EnvPool("sleep", env_num=n, group_n=1, seed=0, env_kwargs=tag.env_kwargs,
                         backend="thread", num_workers=2, tag="serve") as pool:
                lock = TrajectoryCollector(pool, policy, [tag], base)
                for _ in range(2):  # the server warms up on first use
                    _collect(lock, seed=0)
                metrics, _ = _collect(lock, seed=0)
            l_turn = metrics["timing/policy_s"] / max(1.0, metrics["timing/turns"])
            for ratio in settings.ratios:
                progress(f"openai: L/E = {ratio:g}")
                # two lanes: a turn of n envs waits n/2 steps per lane
                sleep_ms = 1000.0 * l_turn / ratio / (n / 2)
                kw = {"sleep_ms": sleep_ms, "episode_len": 10**9}
                tag = replace(tag, env_kwargs=kw)
                with EnvPool("sleep", env_num=n, group_n=1, seed=0, env_kwargs=kw,
                             backend="thread", num_workers=2, tag="serve") as pool:
                    row = Row("openai", ratio, n, settings.openai_turns)
                    rows.append(_compare(pool, policy, [tag], base, row, seed=1,
                                         repeats=settings.openai_repeats))
                row.extra |= {"l_turn_calibrated_s": l_turn, "sleep_ms": sleep_ms,
                             "env_lanes": 2, "server": "transformers serve "
                             "--continuous-batching (tiny offline Llama, CPU)",
                             "requests": policy.stats.requests,
                             "failures": policy.stats.failures}
        finally:
            policy.close()
    return rows


def run_benchmark(settings: Settings, progress: Callable[[str], None] = lambda s: None
                  ) -> dict[str, Any]:
    started = time.perf_counter()
    rows = run_scripted(settings, progress) if settings.scripted else []
    if settings.openai:
        rows += run_openai(settings, progress)
    return {
        "machine": machine_info(
            load_avg=list(os.getloadavg())),
        "settings": asdict(settings),
        "goal": f"async wall <= {GOAL} x max(total L, total E)",
        "rows": [asdict(r) for r in rows],
        "elapsed_s": time.perf_counter() - started,
    }


# ------------------------------------------------------------------ output
def render(report: dict[str, Any]) -> list[Any]:
    from rich.table import Table

    table = Table(title="lock-step vs async collection, seconds (shared machine: noisy)",
                  title_justify="left")
    for col in ("case", "L/E", "target", "lock", "L", "E", "async", "speedup", "async/max",
                "<=1.1", "overlap", "same"):
        table.add_column(col, justify="left" if col == "case" else "right")
    for r in report["rows"]:
        lock, asy = r["lockstep"], r["asynchronous"]
        table.add_row(
            r["case"], f"{r['ratio_measured']:.2f}", f"{r['ratio_target']:g}",
            f"{lock['wall_s']:.2f}", f"{lock['policy_s']:.2f}", f"{lock['env_s']:.2f}",
            f"{asy['wall_s']:.2f}", f"{r['speedup']:.2f}x", f"{r['async_over_max']:.2f}",
            "yes" if r["met"] else "no", f"{asy['overlap_ratio']:.0%}",
            "yes" if r["identical"] else "no")
    return [table, "L, E: lock-step totals (timing/policy_s, timing/env_s); async/max: async "
                   "wall / max(L, E); overlap: share of the shorter side hidden behind the "
                   "other in async mode; same: identical trajectories in both modes. "
                   f"elapsed {report['elapsed_s']:.0f} s"]


def plot(report: dict[str, Any], path: Path) -> None:
    """Wall time per case and ratio: lock-step, async, and the max(L, E) / L + E marks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [c for c in ("scripted", "scripted_parallel", "openai")
             if any(r["case"] == c for r in report["rows"])]
    fig, axes = plt.subplots(1, max(1, len(cases)), figsize=(6.0 * max(1, len(cases)), 4.2),
                             squeeze=False)
    for ax, case in zip(axes[0], cases):
        rows = [r for r in report["rows"] if r["case"] == case]
        xs = list(range(len(rows)))
        locks = [r["lockstep"] for r in rows]
        ax.bar([x - 0.2 for x in xs], [lock["wall_s"] for lock in locks], width=0.4,
               label="lock-step wall")
        ax.bar([x + 0.2 for x in xs], [r["asynchronous"]["wall_s"] for r in rows], width=0.4,
               label="async wall")
        bound = [max(lock["policy_s"], lock["env_s"]) for lock in locks]
        ax.plot(xs, bound, "k_", markersize=30, mew=2, label="max(L, E)")
        ax.plot(xs, [GOAL * b for b in bound], "r_", markersize=30, mew=1,
                label=f"{GOAL} x max(L, E)")
        ax.plot(xs, [lock["policy_s"] + lock["env_s"] for lock in locks], "k.",
                label="L + E")
        ax.set_xticks(xs, [f"L/E={r['ratio_measured']:.2f}\n(set {r['ratio_target']:g})"
                           for r in rows])
        ax.set_ylabel("seconds")
        ax.set_title(case)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"turnpool bench rollout ({report['machine']['cpu_count']} cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------ CLI
@click.command(name="rollout")
@json_option("Write the full report as JSON.")
@plot_option("Save a PNG of the wall times.")
@click.option("--quick", is_flag=True, help="Small sizes: a smoke run of a few seconds.")
@click.option("--scripted/--no-scripted", default=True,
              help="Run case (a), the scripted policy (default: on).")
@click.option("--openai/--no-openai", default=True,
              help="Run case (b) against transformers serve (default: on).")
@click.option("--envs", type=int, default=None, help="Envs in case (a) (default 64).")
@click.option("--turns", type=int, default=None, help="Turns in case (a) (default 10).")
@click.option("--step-ms", type=float, default=None,
              help="CPU per env step in case (a), in ms (default 2).")
@click.option("--workers", type=int, default=None,
              help="Env worker processes in case (a) (default: one per core).")
@click.option("--max-batch", type=int, default=None,
              help="Async micro-batch size in case (a) (default: envs / 8).")
@click.option("--policy-workers", type=int, default=None,
              help="Async policy calls in flight in case (a) (default 8).")
@click.option("--repeats", type=int, default=None,
              help="Runs per mode and row in case (a); the fastest is kept (default 1).")
def command(json_path: Path | None, plot_path: Path | None, quick: bool, scripted: bool,
            openai: bool, envs: int | None, turns: int | None, step_ms: float | None,
            workers: int | None, max_batch: int | None, policy_workers: int | None,
            repeats: int | None) -> None:
    """Lock-step vs async wall time for L/E = 0.5, 1, 2 (scripted and openai policies)."""
    console = start(width=132)
    settings = Settings(scripted=scripted, openai=openai, workers=workers, quick=quick)
    if quick:
        settings.ratios, settings.envs, settings.turns, settings.step_ms = (1.0,), 8, 3, 1.0
        settings.max_batch, settings.policy_workers, settings.parallel = 2, 2, False
        settings.openai_envs, settings.openai_turns, settings.openai_repeats = 4, 2, 1
    settings.envs = envs or settings.envs
    settings.turns = turns or settings.turns
    settings.step_ms = step_ms or settings.step_ms
    settings.max_batch = max_batch or settings.max_batch
    settings.policy_workers = policy_workers or settings.policy_workers
    settings.repeats = repeats or settings.repeats
    report = measure_and_print(console, lambda progress: run_benchmark(settings, progress),
                               render)
    write_outputs(console, report, json_path, plot_path, plot)


__all__ = ["Row", "Settings", "SleepPolicy", "command", "run_benchmark"]
