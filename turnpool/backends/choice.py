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

What a backend cannot do for these envs or this caller is checked here, once, before it
starts (`refuse_unsupported`, called by `start_backend`): worker processes started by spawn or
forkserver re-run the main script's top-level code, so a pool created by unguarded top-level
code (no ``if __name__ == "__main__":``) would make every worker create a pool in turn
(`unguarded_main_call`); and envs that draw from the process-global RNG cannot share a
process across threads (their draws would interleave), on ``thread`` or joblib's
``threading``. Either is a `BackendUnavailable` naming the fix (``fallback=True`` runs
sequentially instead, with one warning); ``auto`` never picks processes from unguarded code.

    >>> from turnpool.backends.choice import choose_backend
    >>> from turnpool.worker.build import EnvBuild
    >>> builds = [EnvBuild(0, "turnpool.envs.synthetic:TrivialEnv", {})]
    >>> choice = choose_backend("sequential", builds, None, (None, None))
    >>> choice.name, choice.label
    ('sequential', 'sequential')
"""

from __future__ import annotations

import ast
import functools
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from turnpool.backends.auto import EnvProfile, choose, fmt_seconds, measure_env
from turnpool.backends.base import Backend, one_per_core, raise_build_errors
from turnpool.envs.registry import draws_from_global_rng
from turnpool.worker.build import EnvBuild
from turnpool.worker.deadline import signal_timer_free
from turnpool.worker.errors import BackendUnavailable, short_error

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


# ====================================================================== capabilities
def refuse_unsupported(backend: Backend, options: dict[str, Any]) -> None:
    """Raise `BackendUnavailable` naming the fix when ``backend`` (made, not started) cannot
    run its envs for this caller (see the module docstring); the one place these checks are
    made. ``options`` are the backend options it was made with."""
    name, method = backend.name, backend.mp_context
    if name in ("process", "process_pool") and method != "fork" and unguarded_main_call():
        raise BackendUnavailable(
            f"{name} workers ({method}) re-run the main script's top-level code; "
            "create the pool under `if __name__ == \"__main__\":`")
    threads = name == "thread" or (name == "joblib"
                                   and options.get("joblib_backend") == "threading")
    if not threads or backend.num_workers < 2:
        return
    shared = {n for b in backend.builds
              if (n := draws_from_global_rng(b.entry_point, b.kwargs))}
    if shared:  # their draws would interleave across threads
        raise BackendUnavailable(
            f"{', '.join(sorted(shared))} draw from the process-global RNG, so threads would "
            "interleave their draws; use backend 'process' or 'sequential'")


def unguarded_main_call() -> bool:
    """Is this call made by top-level code of the ``__main__`` script that is not under
    ``if __name__ == "__main__":``? Spawn/forkserver children re-run exactly that code."""
    main = sys.modules.get("__main__")
    path = vars(main).get("__file__") if main is not None else None
    if main is None or not path:
        return False  # -c, an interactive session, a notebook: nothing is re-run
    spec = main.__spec__
    if spec is not None and (spec.name == "__main__" or spec.name.endswith(".__main__")):
        return False  # `python -m package`: multiprocessing does not re-run a package main
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is main.__dict__:
            return not _guarded_line(str(path), frame.f_lineno)
        frame = frame.f_back  # type: ignore[assignment]
    return False  # main's top level has finished (or is not on the stack)


@functools.lru_cache(maxsize=8)
def _guard_ranges(path: str) -> tuple[tuple[int, int], ...] | None:
    """Line ranges of the ``if __name__ == "__main__":`` blocks of a script (None: unreadable)."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    ranges = []
    for node in tree.body:
        if isinstance(node, ast.If) and _is_main_test(node.test):
            ranges.append((node.body[0].lineno, node.end_lineno or node.body[-1].lineno))
    return tuple(ranges)


def _is_main_test(test: ast.expr) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    consts = [s.value for s in sides if isinstance(s, ast.Constant)]
    return names == ["__name__"] and consts == ["__main__"]


def _guarded_line(path: str, line: int) -> bool:
    ranges = _guard_ranges(path)
    return ranges is not None and any(lo <= line <= hi for lo, hi in ranges)


__all__ = ["AUTO", "BackendChoice", "choose_backend", "fallback_choice", "needs_threads",
           "refuse_unsupported", "unguarded_main_call"]
