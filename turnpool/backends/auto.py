"""auto backend: time one env in the caller at start, then run the pool on the backend that fits.

The measurement (`measure_env`) resets one instance of the pool's first env and steps it a few
times (within `MEASURE_BUDGET_S`), recording wall time and this thread's CPU time per step.
The choice (`choose`) compares the sequential loop with the best parallel option, using the
fixed costs of a worker round trip, of pickling one env's result and of a thread hand-off (the
constants below):

* mostly waiting (CPU < half of wall, e.g. a web env): ``thread``, when the waits add up to
  more than the hand-offs cost;
* CPU-bound and worth splitting over the cores: ``process``;
* otherwise (microsecond envs, one core, few envs): ``sequential``, the floor.

Deadlines: with a ``step_timeout`` set, ``sequential`` is a candidate only where it can stop a
hung env in-process with a timer signal (the main thread, ``SIGALRM`` unused by the program,
see `turnpool.worker.deadline`); elsewhere auto picks the better of ``thread`` and ``process``,
which return within the deadline whatever the env does.

A parallel choice must beat sequential by 20% on these estimates, so a close call stays
in-process. Called from a script's unguarded top-level code (no ``if __name__ ==
"__main__":``), auto never picks processes, which would re-run that code in every worker (see
`turnpool.backends.process.unguarded_main_call`); this keeps pasted snippets working.
Any env can be measured: the probe action is a named action, else a seeded sample of the
env's ``action_space``. ``pool.backend_name`` reports the choice, e.g. ``"auto->sequential"``, and
`AutoBackend.profile` holds the measurement. If the chosen backend cannot start, auto runs
sequentially.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from turnpool.backends.base import Backend, BackendUnavailable, one_per_core, raise_build_errors
from turnpool.worker.deadline import signal_timer_free
from turnpool.worker.protocol import EnvBuild, Reply, Request, short_error

log = logging.getLogger(__name__)

#: Per-step cost of one round trip to a worker process, and of pickling one env's result.
PROCESS_ROUND_TRIP_S = 60e-6
PROCESS_PER_ENV_S = 1.5e-6
#: Per-step cost of handing work to a thread and getting it back.
THREAD_HANDOFF_S = 50e-6
#: A parallel backend must be estimated this much faster than sequential to be chosen.
MARGIN = 1.2
MEASURE_BUDGET_S = 0.05
MEASURE_MAX_STEPS = 20


@dataclass(frozen=True)
class EnvProfile:
    """What one env costs in the caller: medians over the measured steps."""

    step_wall_s: float
    step_cpu_s: float
    reset_wall_s: float
    steps: int

    @property
    def cpu_share(self) -> float:
        """CPU time over wall time (1.0 = pure computation, ~0 = pure waiting)."""
        return min(1.0, self.step_cpu_s / self.step_wall_s) if self.step_wall_s > 0 else 1.0


def _probe_action(env: Any) -> Any:
    """An action to time steps with: the env's first named action, else a seeded sample of
    its ``action_space`` (any gymnasium-style env), else a word it will reject cheaply."""
    lookup_for = getattr(env, "action_lookup_for_episode", None)
    lookup = lookup_for() if callable(lookup_for) else None
    if lookup:
        return next(iter(lookup))
    space = getattr(env, "action_space", None)
    if space is not None and hasattr(space, "sample"):
        try:
            space.seed(0)
            return space.sample()
        except Exception as exc:  # a space that cannot sample: fall back to a plain word
            log.debug("auto: sampling %r failed (%s)", space, exc)
    return "noop"


def measure_env(build: EnvBuild, budget_s: float = MEASURE_BUDGET_S,
                max_steps: int = MEASURE_MAX_STEPS) -> EnvProfile:
    """Reset and step one instance of ``build`` in this thread; episodes that end are reset
    (with the next seed) and the stepping goes on."""
    env = build.build()
    try:
        t0 = time.perf_counter()
        env.reset(seed=0)
        reset_wall = time.perf_counter() - t0
        action = _probe_action(env)
        walls: list[float] = []
        cpus: list[float] = []
        deadline = time.perf_counter() + budget_s
        seed = 0
        while len(walls) < max_steps and (len(walls) < 3 or time.perf_counter() < deadline):
            c0, w0 = time.thread_time(), time.perf_counter()
            _obs, _r, terminated, truncated, _info = env.step(action)
            walls.append(time.perf_counter() - w0)
            cpus.append(time.thread_time() - c0)
            if terminated or truncated:
                seed += 1
                env.reset(seed=seed)
                action = _probe_action(env)
    finally:
        env.close()
    return EnvProfile(statistics.median(walls), statistics.median(cpus), reset_wall,
                      len(walls))


def choose(profile: EnvProfile, num_envs: int, cores: int,
           num_workers: int | None = None, in_process: bool = True,
           allow_process: bool = True) -> tuple[str, float]:
    """``(backend, estimated seconds per pool step)`` for ``num_envs`` envs like ``profile``;
    ``in_process=False``: sequential cannot honour the deadline, pick a parallel backend;
    ``allow_process=False`` leaves processes out."""
    per_env = profile.step_wall_s
    sequential = num_envs * per_env
    options = [("sequential", sequential)]
    if profile.cpu_share < 0.5 or not in_process:
        threads = max(1, min(num_workers or 16, num_envs))
        waits = num_envs * per_env * (1 - profile.cpu_share)
        work = num_envs * per_env * profile.cpu_share  # still serialised by the GIL
        options.append(("thread", work + waits / threads + THREAD_HANDOFF_S))
    workers = max(1, min(num_workers or cores, num_envs))
    if workers >= 2 and allow_process:
        options.append(("process", sequential / workers + PROCESS_ROUND_TRIP_S
                        + PROCESS_PER_ENV_S * num_envs / workers))
    best = min(options[1:], key=lambda o: o[1], default=None)
    if best is not None and (best[1] * MARGIN < sequential or not in_process):
        return best
    return options[0]


class AutoBackend(Backend):
    """Delegates every protocol call to the backend chosen in `start`."""

    name: ClassVar[str] = "auto"

    def __init__(self, builds: Sequence[EnvBuild], num_workers: int | None = None, *,
                 mp_context: str | None = None, **options: Any) -> None:
        super().__init__(builds, num_workers, mp_context=mp_context, **options)
        self._requested_workers = num_workers
        self._delegate: Backend | None = None
        self.profile: EnvProfile | None = None
        self.estimate_s: float | None = None

    def start(self, timeout: float) -> None:
        from turnpool.backends import start_backend
        from turnpool.backends.process import unguarded_main_call

        allow_process = not unguarded_main_call()
        if not allow_process:
            log.info("auto: called from the main script's unguarded top level; "
                     "no worker processes")
        try:
            first = self.builds[0].build()
        except Exception as exc:  # the env cannot be built anywhere: say so now
            raise_build_errors({self.builds[0].env_id: short_error(exc)})
        first.close()
        in_process = self.step_timeout is None or signal_timer_free()
        try:
            self.profile = measure_env(self.builds[0])
        except Exception as exc:  # an env that fails in the caller gains nothing from workers
            log.warning("auto: measuring %s failed (%s); running sequentially",
                        self.builds[0].entry_point, short_error(exc))
            choice, self.estimate_s = ("sequential" if in_process else "thread"), None
        else:
            cores = one_per_core(len(self.builds))
            choice, self.estimate_s = choose(self.profile, len(self.builds), cores,
                                             self._requested_workers, in_process,
                                             allow_process)
            log.info("auto: %s per step (%.0f%% CPU) x %d envs -> %s", _fmt(
                self.profile.step_wall_s), 100 * self.profile.cpu_share, len(self.builds),
                choice)
        try:
            delegate = start_backend(choice, self.builds, self._requested_workers,
                                     self.mp_context, self.options,
                                     (self.step_timeout, self.reset_timeout), timeout)
        except (BackendUnavailable, OSError) as exc:
            raise BackendUnavailable(f"auto: not even the sequential backend started: "
                                     f"{short_error(exc)}") from exc
        self._delegate = delegate
        self.slices = delegate.slices
        # The chosen backend is part of this instance's identity (pool.backend_name).
        setattr(self, "name", f"auto->{delegate.name}")  # noqa: B010

    @property
    def delegate(self) -> Backend:
        if self._delegate is None:
            raise RuntimeError("auto backend not started")
        return self._delegate

    def send(self, worker: int, request: Request) -> None:
        self.delegate.send(worker, request)

    def wait(self, workers: Collection[int], timeout: float | None) -> list[int]:
        return self.delegate.wait(workers, timeout)

    def recv(self, worker: int) -> Reply:
        return self.delegate.recv(worker)

    def progress(self, worker: int) -> tuple[int, float] | None:
        return self.delegate.progress(worker)

    def restart(self, worker: int) -> None:
        self.delegate.restart(worker)

    def close(self) -> None:
        if self._delegate is not None:
            self._delegate.close()

    def worker_pids(self) -> list[int]:
        return self._delegate.worker_pids() if self._delegate is not None else []


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} µs" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


__all__ = ["AutoBackend", "EnvProfile", "choose", "measure_env"]
