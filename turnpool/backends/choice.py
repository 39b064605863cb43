"""The one choice of backend, made when the pool starts.

`turnpool.backends.start_backend` asks `choose_backend` which backend runs the pool, once;
that backend then keeps its shape for the pool's life (no backend turns into another). The
rules:

* a named backend runs as named, except that a deadline set off the main thread needs
  threads: ``sequential`` with a ``step_timeout`` or ``reset_timeout``, started where the timer
  signal cannot be used (`turnpool.worker.deadline.signal_timer_free`: another thread, a
  program that took ``SIGALRM``), runs on the thread backend over the same slices
  (``pool.backend_name == "sequential->thread"``), which waits for each env within the
  deadline and gives up on a stuck one;
* ``auto`` measures one env in the caller and picks sequential, thread or process
  (`turnpool.backends.auto`) under the same rule (``"auto->thread"``, ...);
* what happens when the chosen backend cannot start is `start_backend`'s: only ``auto``, or a
  caller that passed ``fallback=True``, falls back to sequential.

    >>> from turnpool.backends.choice import choose_backend
    >>> from turnpool.worker.build import EnvBuild
    >>> builds = [EnvBuild(0, "turnpool.envs.synthetic:TrivialEnv", {})]
    >>> choice = choose_backend("sequential", builds, None, (None, None))
    >>> choice.name, choice.label
    ('sequential', 'sequential')
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from turnpool.backends.auto import EnvProfile, choose, fmt_seconds, measure_env
from turnpool.backends.base import one_per_core, raise_build_errors
from turnpool.worker.build import EnvBuild
from turnpool.worker.deadline import signal_timer_free
from turnpool.worker.errors import short_error

log = logging.getLogger(__name__)

#: The backend name that is a choice rather than a backend class.
AUTO = "auto"


@dataclass(frozen=True)
class BackendChoice:
    """Which backend runs a pool: ``name`` (a key of `turnpool.backends.BACKENDS`) over
    ``num_workers`` workers (None: its default), reported as ``label``
    (``pool.backend_name``); for ``auto``, the measurement and the estimate behind it."""

    requested: str
    name: str
    num_workers: int | None
    label: str
    profile: EnvProfile | None = None
    estimate_s: float | None = None

    @property
    def is_auto(self) -> bool:
        return self.requested == AUTO


def needs_threads(timeouts: tuple[float | None, float | None]) -> bool:
    """Does running envs in this thread leave a deadline unenforceable (a deadline is set and
    this thread cannot use the timer signal)?"""
    return any(t is not None for t in timeouts) and not signal_timer_free()


def choose_backend(requested: str, builds: Sequence[EnvBuild], num_workers: int | None,
                   timeouts: tuple[float | None, float | None]) -> BackendChoice:
    """The backend to start for ``requested`` (see the module docstring); may raise
    `turnpool.worker.errors.EnvBuildError` when ``auto`` cannot build the env it measures."""
    if requested == AUTO:
        return _choose_auto(builds, num_workers, timeouts)
    if requested == "sequential" and needs_threads(timeouts):
        # the same slices as sequential (one worker unless told), each on its own thread
        return BackendChoice(requested, "thread", num_workers or 1, "sequential->thread")
    return BackendChoice(requested, requested, num_workers, requested)


def _choose_auto(builds: Sequence[EnvBuild], num_workers: int | None,
                 timeouts: tuple[float | None, float | None]) -> BackendChoice:
    from turnpool.backends.process import unguarded_main_call

    allow_process = not unguarded_main_call()
    if not allow_process:
        log.info("auto: called from the main script's unguarded top level; no worker processes")
    try:
        builds[0].build().close()
    except Exception as exc:  # the env cannot be built anywhere: say so now
        raise_build_errors({builds[0].env_id: short_error(exc)})
    in_process = not needs_threads(timeouts)
    try:
        profile = measure_env(builds[0])
    except Exception as exc:  # an env that fails in the caller gains nothing from workers
        log.warning("auto: measuring %s failed (%s); running sequentially",
                    builds[0].entry_point, short_error(exc))
        name = "sequential" if in_process else "thread"
        return BackendChoice(AUTO, name, num_workers, f"{AUTO}->{name}")
    name, estimate = choose(profile, len(builds), one_per_core(len(builds)), num_workers,
                            in_process, allow_process)
    log.info("auto: %s per step (%.0f%% CPU) x %d envs -> %s", fmt_seconds(profile.step_wall_s),
             100 * profile.cpu_share, len(builds), name)
    return BackendChoice(AUTO, name, num_workers, f"{AUTO}->{name}", profile, estimate)


def fallback_choice(failed: BackendChoice,
                    timeouts: tuple[float | None, float | None]) -> BackendChoice:
    """What runs when ``failed`` cannot start: sequential, one worker (threads where a
    deadline needs them), labelled as auto's choice when auto had chosen."""
    choice = choose_backend("sequential", [], 1, timeouts)
    if failed.is_auto:
        return BackendChoice(AUTO, choice.name, 1, f"{AUTO}->{choice.name}")
    return choice


__all__ = ["AUTO", "BackendChoice", "choose_backend", "fallback_choice", "needs_threads"]
