"""Backends: where the pool's envs run. One file per backend, all behind `base.Backend`.

Backends are looked up by name and imported lazily, so optional dependencies (ray, joblib) are
only imported when chosen, and the pool never imports a concrete backend module. Which
backend runs is decided once, when the pool starts (`start_backend`, `choice.choose_backend`);
a backend the user names is never silently replaced by another.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from turnpool.backends.base import Backend, BackendUnavailable
from turnpool.backends.choice import (
    AUTO,
    BackendChoice,
    choose_backend,
    fallback_choice,
    refuse_unsupported,
)
from turnpool.envs.entry import load_entry_point
from turnpool.extras import MissingExtra
from turnpool.worker.build import EnvBuild
from turnpool.worker.errors import short_error

log = logging.getLogger(__name__)

#: name -> "module:Class"; a new backend adds one line here. ``auto`` names no class: it is a
#: choice that `start_backend` makes once, when the pool starts (`turnpool.backends.choice`).
BACKENDS: dict[str, str] = {
    "sequential": "turnpool.backends.sequential:SequentialBackend",
    "thread": "turnpool.backends.thread:ThreadBackend",
    "process": "turnpool.backends.process:ProcessBackend",
    "process_pool": "turnpool.backends.process_pool:ProcessPoolBackend",
    "joblib": "turnpool.backends.joblib:JoblibBackend",
    "ray": "turnpool.backends.ray:RayBackend",
    AUTO: "",
}

#: Backends that run in this process's own Ray-free runtime: the equivalence tests run over
#: these (ray is checked in its own test module, which owns the Ray runtime while it runs).
LOCAL_BACKENDS: list[str] = [name for name in BACKENDS if name != "ray"]


def get_backend(name: str) -> type[Backend]:
    """The backend class registered under ``name``: import errors, and ``auto`` (a choice, not
    a class), are `BackendUnavailable`; an unknown name is a `ValueError`."""
    entry = BACKENDS.get(name)
    if entry is None:
        raise ValueError(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
    if not entry:
        raise BackendUnavailable(f"{name!r} is not one backend: start_backend picks one")
    try:  # the registry names classes by string so that optional backends load lazily
        cls: type[Backend] = load_entry_point(entry)
    except ImportError as exc:
        raise BackendUnavailable(f"backend {name!r} cannot be imported: {exc}") from exc
    return cls


def start_backend(name: str, builds: Sequence[EnvBuild], num_workers: int | None,
                  mp_context: str | None, options: dict[str, Any],
                  timeouts: tuple[float | None, float | None], start_timeout: float, *,
                  fallback: bool = False) -> Backend:
    """The backend ``name`` over ``builds``, chosen once (`choose_backend`) and started with
    the pool's deadlines ``(step_timeout, reset_timeout)``.

    A backend that cannot start raises `BackendUnavailable` naming the fix, unless ``name``
    is ``auto`` or ``fallback`` is set: then the sequential backend runs instead, with a
    logged warning naming the cause. `EnvBuildError` (the envs, not the backend, are broken)
    is never a reason to fall back.
    """
    choice = choose_backend(name, builds, num_workers, timeouts)
    try:
        return _start(choice, builds, mp_context, options, timeouts, start_timeout)
    except (BackendUnavailable, OSError, ImportError) as exc:
        if choice.name == "sequential" or not (fallback or choice.is_auto):
            raise _unavailable(choice, exc) from exc
        log.warning("backend %r cannot start (%s); falling back to sequential", choice.label,
                    _reason(exc))
    last = fallback_choice(choice, timeouts)
    try:
        return _start(last, builds, None, {}, timeouts, start_timeout)
    except (BackendUnavailable, OSError, ImportError) as exc:
        raise BackendUnavailable(f"{name}: not even the sequential backend started: "
                                 f"{_reason(exc)}") from exc


def _start(choice: BackendChoice, builds: Sequence[EnvBuild], mp_context: str | None,
           options: dict[str, Any], timeouts: tuple[float | None, float | None],
           start_timeout: float) -> Backend:
    backend = get_backend(choice.name)(builds, choice.num_workers, mp_context=mp_context,
                                       **options)
    backend.label, backend.profile = choice.label, choice.profile
    backend.step_timeout, backend.reset_timeout = timeouts
    try:
        refuse_unsupported(backend, options)
        backend.start(start_timeout)
    except BaseException:
        backend.close()
        raise
    return backend


def _reason(exc: BaseException) -> str:
    """What went wrong, as one line (the message alone where it already names the fix)."""
    if isinstance(exc, (BackendUnavailable, MissingExtra)):
        return str(exc)
    return short_error(exc)


def _unavailable(choice: BackendChoice, exc: BaseException) -> BackendUnavailable:
    return BackendUnavailable(f"backend {choice.label!r} cannot start: {_reason(exc)}")


__all__ = ["AUTO", "BACKENDS", "LOCAL_BACKENDS", "Backend", "BackendChoice",
           "BackendUnavailable", "choose_backend", "get_backend", "start_backend"]
