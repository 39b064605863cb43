"""The cost model behind ``backend="auto"``: time one env in the caller, pick the backend that fits.

"auto" is a name, not a backend class: `turnpool.backends.choice.choose_backend` calls this
module once, when the pool starts, and the pool then runs on the backend picked.

The measurement (`measure_env`) resets one instance of the pool's first env and steps it a few
times (within `MEASURE_BUDGET_S`), recording wall time and this thread's CPU time per step.
The choice (`choose`) compares the sequential loop with the best parallel option, using the
fixed costs of a worker round trip, of pickling one env's result and of a thread hand-off (the
constants below):

* mostly waiting (CPU < half of wall, e.g. a web env): ``thread``, when the waits add up to
  more than the hand-offs cost;
* CPU-bound and worth splitting over the cores: ``process``;
* otherwise (microsecond envs, one core, few envs): ``sequential``, the floor.

A worker count (``num_workers``, ``--workers``) sizes the parallel options but does not ask
for them: processes never run more envs at once than there are cores, and an env that steps
in under `IN_PROCESS_STEP_S` stays in-process whatever the count (a worker process costs more
to start and to talk to than it saves; name ``backend="process"`` to have workers anyway).

Deadlines: with a ``step_timeout`` set, ``sequential`` is a candidate only where it can stop a
hung env in-process with a timer signal (the main thread, ``SIGALRM`` unused by the program,
see `turnpool.worker.deadline`); elsewhere auto picks the better of ``thread`` and ``process``,
which return within the deadline whatever the env does.

A parallel choice must beat sequential by 20% on these estimates, so a close call stays
in-process. Called from a script's unguarded top-level code (no ``if __name__ ==
"__main__":``), auto never picks processes, which would re-run that code in every worker (see
`turnpool.backends.choice.unguarded_main_call`); this keeps pasted snippets working.
Any env can be measured: the probe action is a named action, else a seeded sample of the
env's ``action_space``. ``pool.backend_name`` reports the choice, e.g. ``"auto->sequential"``, and
``pool.backend.profile`` holds the measurement. If the chosen backend cannot start, auto runs
sequentially.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass
from typing import Any

from turnpool.envs.base import TextEnv
from turnpool.worker.build import EnvBuild

log = logging.getLogger(__name__)

#: Per-step cost of one round trip to a worker process, and of pickling one env's result.
PROCESS_ROUND_TRIP_S = 60e-6
PROCESS_PER_ENV_S = 1.5e-6
#: Per-step cost of handing work to a thread and getting it back.
THREAD_HANDOFF_S = 50e-6
#: A parallel backend must be estimated this much faster than sequential to be chosen.
MARGIN = 1.2
#: An env stepping faster than this stays in-process under auto (Sokoban steps in ~2-40 us).
IN_PROCESS_STEP_S = 100e-6
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


def _probe_action(env: TextEnv) -> Any:
    """An action to time steps with: the env's first named action, else a seeded sample of
    its ``action_space`` (any gymnasium-style env), else a word it will reject cheaply."""
    lookup = env.action_lookup_for_episode()
    if lookup:
        return next(iter(lookup))
    try:
        space = env.action_space
        space.seed(0)
        return space.sample()
    except Exception as exc:  # a space that cannot sample: fall back to a plain word
        log.debug("auto: sampling the action space of %s failed (%s)", type(env).__name__, exc)
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
    at_once = min(workers, cores)  # more workers than cores take turns on them
    worth_a_process = per_env >= IN_PROCESS_STEP_S or not in_process
    if workers >= 2 and allow_process and worth_a_process:
        options.append(("process", sequential / at_once + PROCESS_ROUND_TRIP_S
                        + PROCESS_PER_ENV_S * num_envs / at_once))
    best = min(options[1:], key=lambda o: o[1], default=None)
    if best is not None and (best[1] * MARGIN < sequential or not in_process):
        return best
    return options[0]


def fmt_seconds(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} µs" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


__all__ = ["EnvProfile", "choose", "fmt_seconds", "measure_env"]
