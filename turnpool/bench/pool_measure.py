"""What `turnpool.bench.pool` measures and how: its settings, the env cases, one timed row
per backend and size (`measure_pool`), the gymnasium ``AsyncVectorEnv`` reference column
(`measure_gym`) and Sokoban's in-process turn (`measure_sokoban_turn`). The module docstring
of `turnpool.bench.pool` explains the benchmark.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from turnpool.backends import BACKENDS

log = logging.getLogger(__name__)

BENCH_BACKENDS = tuple(BACKENDS)  # every registered backend, ray included
ALL_ENVS = ("trivial", "cpu", "sleep", "sokoban")
ALL_SIZES = (8, 64, 256)
GYM = "gym_async"
#: the floor row: the same envs over bare pipes (`turnpool.bench.pool_floor`)
FLOOR = "bare_pipes"
THREAD16 = "thread16"
RAY2 = "ray_2actors"
# Episodes long enough that no synthetic env finishes while it is being timed.
_ENDLESS = 10**9


@dataclass
class Settings:
    """What to run and how long to time each configuration."""

    backends: tuple[str, ...] = BENCH_BACKENDS
    envs: tuple[str, ...] = ALL_ENVS
    sizes: tuple[int, ...] = ALL_SIZES
    workers: int | None = None
    mp_context: str | None = None
    gym: bool = True
    gym_max_n: int = 256
    #: env kinds that get the AsyncVectorEnv column (None: all)
    gym_envs: tuple[str, ...] | None = None
    thread16: bool = True
    #: the ``bare_pipes`` floor row on these env kinds (empty: none)
    floor_envs: tuple[str, ...] = ("trivial", "cpu")
    min_time_s: float = 0.3
    repeats: int = 3
    warmup: int = 3
    #: the steps right after the pool's start (and first reset) timed on their own (`first_s`)
    first_steps: int = 10
    cpu_target_ms: float = 1.0
    sokoban_turn: bool = True
    quick: bool = False
    #: a row measured while other processes used more than this share of the machine is
    #: measured again (up to ``retries`` times) and the least disturbed attempt is kept
    max_other_load: float = 0.15
    retries: int = 1
    #: before each row, wait up to this long for the machine to be that quiet
    wait_quiet_s: float = 0.0


@dataclass
class EnvCase:
    """One env kind as the benchmark drives it."""

    name: str
    env_type: str
    kwargs: dict[str, Any]
    #: Steps that can be timed after one reset before an episode may end.
    steps_per_reset: int = 1 << 30
    #: action ids cycle through 1..n_actions (shifted per env so envs differ)
    n_actions: int = 4


@dataclass
class Row:
    """One measured configuration: ``batch_s`` is the median wall time of one pool step."""

    env: str
    backend: str
    n: int
    batch_s: float
    best_batch_s: float
    steps: int
    workers: int | None = None
    active_backend: str = ""
    other_load: float | None = None
    error: str | None = None
    #: mean wall time of one pool step over the first ``first_steps`` steps after start
    first_s: float | None = None
    #: CPU seconds per pool step of this process tree while timed (the caller and its
    #: workers; Ray's actors are not children; a reset inside a block counts too): steadier
    #: than wall time on a shared machine
    cpu_s: float | None = None

    @property
    def us_per_env_step(self) -> float:
        return self.batch_s / self.n * 1e6

    @property
    def cpu_us_per_env_step(self) -> float | None:
        return None if self.cpu_s is None else self.cpu_s / self.n * 1e6


# --------------------------------------------------------------------------- measuring
class OtherLoad:
    """CPU share used by processes outside this process tree while a measurement ran.

    The machine is shared; this number says how much to trust a row. Ray actors are not our
    children, so their work counts as "other" in Ray rows.
    """

    def __init__(self) -> None:
        #: CPU seconds this process tree used in the last window (`stop`)
        self.own_s: float | None = None
        try:
            import psutil
        except ImportError:
            self._psutil: Any = None
            return
        self._psutil = psutil
        self._start: tuple[float, float, float] | None = None

    def _sample(self) -> tuple[float, float, float]:
        psutil = self._psutil
        cpu = psutil.cpu_times()
        busy = sum(cpu) - cpu.idle - getattr(cpu, "iowait", 0.0)
        own = 0.0
        me = psutil.Process()
        for proc in [me, *me.children(recursive=True)]:
            try:
                own += _cpu_seconds(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return time.perf_counter(), busy, own

    def start(self) -> None:
        if self._psutil is not None:
            self._start = self._sample()

    def wait_quiet(self, threshold: float, max_s: float, window_s: float = 0.25) -> None:
        """Sleep in short windows until others use less than ``threshold`` of the machine."""
        if self._psutil is None or max_s <= 0:
            return
        deadline = time.perf_counter() + max_s
        while time.perf_counter() < deadline:
            self.start()
            time.sleep(window_s)
            other = self.stop()
            if other is None or other <= threshold:
                return

    def stop(self) -> float | None:
        if self._psutil is None or self._start is None:
            return None
        t1, busy1, own1 = self._sample()
        t0, busy0, own0 = self._start
        self.own_s = max(0.0, own1 - own0)
        wall = max(t1 - t0, 1e-9) * (os.cpu_count() or 1)
        return max(0.0, min(1.0, ((busy1 - busy0) - max(0.0, own1 - own0)) / wall))


def _cpu_seconds(proc: Any) -> float:
    """A process's CPU seconds, all threads: to the nanosecond from each thread's
    ``/proc/<pid>/task/<tid>/schedstat`` on Linux (``cpu_times`` counts 10 ms ticks, too
    coarse for a block of a few hundred ms), else psutil's ``cpu_times``."""
    tasks = f"/proc/{proc.pid}/task"
    try:
        total = 0
        for tid in os.listdir(tasks):
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                with open(f"{tasks}/{tid}/schedstat", "rb") as f:
                    total += int(f.read().split()[0])
        return total / 1e9
    except (OSError, ValueError, IndexError):
        t = proc.cpu_times()
        return float(t.user + t.system)


def _actions(case: EnvCase, n: int, turn: int) -> list[int]:
    return [1 + (turn + i) % case.n_actions for i in range(n)]


def _time_loop(
    reset: Callable[[], object],
    step: Callable[[list[int]], object],
    case: EnvCase,
    n: int,
    settings: Settings,
) -> tuple[float, float, int, float | None, float, float | None]:
    """Median and best seconds per batch step, over ``repeats`` blocks of >= min_time_s,
    the most other load, the mean of the first ``first_steps`` steps after the first reset
    (timed first), and this process tree's CPU seconds per batch step over the blocks."""
    reset()
    t0 = time.perf_counter()
    for turn in range(settings.first_steps):
        step(_actions(case, n, turn))
    first_s = (time.perf_counter() - t0) / max(1, settings.first_steps)
    turn = since_reset = settings.first_steps
    for _ in range(settings.warmup):
        step(_actions(case, n, turn))
        turn += 1
        since_reset += 1
    action_sets = [_actions(case, n, t) for t in range(case.n_actions)]
    load = OtherLoad()
    per_block: list[float] = []
    total = 0
    loads: list[float] = []
    own: float | None = 0.0
    for _ in range(settings.repeats):
        elapsed = 0.0
        count = 0
        load.start()
        while elapsed < settings.min_time_s or count < 2:
            if since_reset >= case.steps_per_reset:
                reset()  # outside the timed region: episodes must not end while timed
                since_reset = 0
            actions = action_sets[turn % case.n_actions]
            t0 = time.perf_counter()
            step(actions)
            elapsed += time.perf_counter() - t0
            count += 1
            turn += 1
            since_reset += 1
        other = load.stop()
        if other is not None:
            loads.append(other)
        own = None if own is None or load.own_s is None else own + load.own_s
        per_block.append(elapsed / count)
        total += count
    return (statistics.median(per_block), min(per_block), total,
            max(loads) if loads else None, first_s,
            None if own is None or not total else own / total)


def calibrate_cpu_iters(target_s: float, budget_s: float = 0.3) -> int:
    """``work_iters`` that make one ``cpu`` env step take about ``target_s`` here and now."""
    from turnpool.envs.registry import make

    iters = 20_000
    for _ in range(3):
        env = make("cpu", work_iters=iters, episode_len=_ENDLESS)
        env.reset(seed=0)
        times: list[float] = []
        deadline = time.perf_counter() + budget_s / 3
        while time.perf_counter() < deadline or len(times) < 3:
            t0 = time.perf_counter()
            env.step(1)
            times.append(time.perf_counter() - t0)
        iters = max(100, int(iters * target_s / statistics.median(times)))
    return iters


def _sokoban_available() -> bool:
    try:
        from turnpool.envs.registry import resolve

        resolve("sokoban")
    except (ImportError, AttributeError, KeyError):
        return False
    return True


def env_cases(settings: Settings) -> list[EnvCase]:
    """The env kinds to run, with the cpu env calibrated to ``cpu_target_ms``."""
    cases: list[EnvCase] = []
    for name in settings.envs:
        if name == "trivial":
            cases.append(EnvCase("trivial", "trivial", {"episode_len": _ENDLESS}))
        elif name == "cpu":
            iters = calibrate_cpu_iters(settings.cpu_target_ms / 1000.0)
            log.info("cpu env: work_iters=%d for ~%.2f ms per step", iters,
                     settings.cpu_target_ms)
            cases.append(EnvCase("cpu", "cpu", {"episode_len": _ENDLESS, "work_iters": iters}))
        elif name == "sleep":
            cases.append(EnvCase("sleep", "sleep", {"episode_len": _ENDLESS, "sleep_ms": 1.0}))
        elif name == "sokoban":
            if not _sokoban_available():
                log.warning("sokoban env is not installed; skipping its column")
                continue
            # A solved room ends its episode; a short block between resets keeps every env
            # stepping (random pushes rarely solve a room within a few moves).
            cases.append(EnvCase("sokoban", "sokoban",
                                 {"dim_room": (6, 6), "num_boxes": 1, "max_steps": _ENDLESS},
                                 steps_per_reset=8))
        else:
            raise click.BadParameter(f"unknown env {name!r}; choose from {ALL_ENVS}")
    return cases


def measure_pool(
    case: EnvCase, backend: str, n: int, settings: Settings, workers: int | None = None
) -> Row:
    """Build an ``EnvPool`` of ``n`` envs on ``backend`` and time its batch step."""
    from turnpool.pool import EnvPool

    kwargs: dict[str, Any] = {}
    if settings.mp_context is not None:
        kwargs["mp_context"] = settings.mp_context
    workers = workers if workers is not None else settings.workers
    pool = EnvPool(case.env_type, env_num=n, group_n=1, seed=0, env_kwargs=case.kwargs,
                   backend=backend, num_workers=workers, step_timeout=120.0, **kwargs)
    try:
        active, actual_workers = str(pool.backend_name), pool.num_workers
        median, best, steps, other, first, cpu = _time_loop(
            pool.reset, pool.step, case, n, settings)
    finally:
        pool.close()
    return Row(case.name, backend, n, median, best, steps, actual_workers, active, other,
               first_s=first, cpu_s=cpu)


# ---------------------------------------------------------------- gymnasium reference
def _make_gym_env(env_type: str, kwargs: dict[str, Any]) -> Any:
    return _gym_adapter()(env_type, kwargs)


@functools.lru_cache(maxsize=1)
def _gym_adapter() -> type:
    import gymnasium
    from gymnasium import spaces

    from turnpool.envs.registry import make

    class GymTextEnv(gymnasium.Env):  # type: ignore[type-arg]
        """A turnpool env seen through gymnasium's API (text obs, int actions)."""

        def __init__(self, env_type: str, kwargs: dict[str, Any]) -> None:
            self.env = make(env_type, **kwargs)
            self.observation_space = spaces.Text(max_length=1 << 16)
            self.action_space = spaces.Discrete(4, start=1)

        def reset(
            self, *, seed: int | None = None, options: dict[str, Any] | None = None
        ) -> tuple[str, dict[str, Any]]:
            super().reset(seed=seed)
            return self.env.reset(seed=seed)

        def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
            return self.env.step(int(action))

        def close(self) -> None:
            self.env.close()

    return GymTextEnv


def measure_gym(case: EnvCase, n: int, settings: Settings) -> Row:
    """gymnasium ``AsyncVectorEnv``: one forked process per env, pickled text obs."""
    import gymnasium
    import numpy as np

    fns = [functools.partial(_make_gym_env, case.env_type, case.kwargs) for _ in range(n)]
    venv = gymnasium.vector.AsyncVectorEnv(fns, shared_memory=False, context="fork")
    try:
        median, best, steps, other, first, cpu = _time_loop(
            lambda: venv.reset(seed=0),
            lambda actions: venv.step(np.asarray(actions, dtype=np.int64)),
            case, n, settings)
    finally:
        venv.close(terminate=True)
    return Row(case.name, GYM, n, median, best, steps, n, "AsyncVectorEnv", other,
               first_s=first, cpu_s=cpu)


# ------------------------------------------------------------------------ the floor
def measure_floor(case: EnvCase, n: int, settings: Settings) -> Row:
    """`turnpool.bench.pool_floor.BarePipes` over ``n`` envs on as many workers as the
    ``process`` backend would use."""
    from turnpool.backends.base import one_per_core
    from turnpool.bench.pool_floor import BarePipes

    floor = BarePipes(case.env_type, case.kwargs, n,
                      settings.workers if settings.workers else one_per_core(n))
    try:
        median, best, steps, other, first, cpu = _time_loop(
            floor.reset, floor.step, case, n, settings)
    finally:
        floor.close()
    return Row(case.name, FLOOR, n, median, best, steps, floor.num_workers,
               "bare pipes", other, first_s=first, cpu_s=cpu)


# ------------------------------------------------------------------ sokoban in-process
def measure_sokoban_turn(settings: Settings) -> dict[str, float] | None:
    """128 Sokoban envs (8 groups x 16): seedless reset and one turn, in-process."""
    if not _sokoban_available():
        return None
    from turnpool.pool import EnvPool

    case = EnvCase("sokoban", "sokoban", {"dim_room": (6, 6), "num_boxes": 1})
    pool = EnvPool("sokoban", env_num=8, group_n=16, seed=0, env_kwargs=case.kwargs,
                   backend="sequential")
    resets: list[float] = []
    turns: list[float] = []
    try:
        deadline = time.perf_counter() + max(settings.min_time_s * settings.repeats, 0.05)
        turn = 0
        while time.perf_counter() < deadline or len(resets) < 3:
            t0 = time.perf_counter()
            pool.reset()  # seedless: a fresh puzzle per episode, so no room is reused
            t1 = time.perf_counter()
            pool.step(_actions(case, 128, turn))
            t2 = time.perf_counter()
            resets.append(t1 - t0)
            turns.append(t2 - t1)
            turn += 1
    finally:
        pool.close()
    return {"reset_ms": statistics.median(resets) * 1e3,
            "turn_ms": statistics.median(turns) * 1e3,
            "best_reset_ms": min(resets) * 1e3, "best_turn_ms": min(turns) * 1e3,
            "samples": float(len(resets))}
