"""Backends: where the pool's envs run. One file per backend, all behind `base.Backend`.

Backends are looked up by name and imported lazily, so optional dependencies (ray, joblib) are
only imported when chosen, and the pool never imports a concrete backend module.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Sequence
from typing import Any

from turnpool.backends.base import Backend, BackendUnavailable
from turnpool.worker.protocol import EnvBuild, short_error

log = logging.getLogger(__name__)

#: name -> "module:Class"; a new backend adds one line here.
BACKENDS: dict[str, str] = {
    "sequential": "turnpool.backends.sequential:SequentialBackend",
    "thread": "turnpool.backends.thread:ThreadBackend",
    "process": "turnpool.backends.process:ProcessBackend",
    "process_pool": "turnpool.backends.process_pool:ProcessPoolBackend",
    "joblib": "turnpool.backends.joblib:JoblibBackend",
    "ray": "turnpool.backends.ray:RayBackend",
    "auto": "turnpool.backends.auto:AutoBackend",
}

#: Backends that run in this process's own Ray-free runtime: the equivalence tests run over
#: these (ray is checked in its own test module, which owns the Ray runtime while it runs).
LOCAL_BACKENDS: list[str] = [name for name in BACKENDS if name != "ray"]


def get_backend(name: str) -> type[Backend]:
    """The backend class registered under ``name`` (import errors surface as
    `BackendUnavailable` so the pool can fall back; an unknown name is a `ValueError`)."""
    entry = BACKENDS.get(name)
    if entry is None:
        raise ValueError(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
    module_name, _, attr = entry.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendUnavailable(f"backend {name!r} cannot be imported: {exc}") from exc
    cls: type[Backend] = getattr(module, attr)
    return cls


def start_backend(name: str, builds: Sequence[EnvBuild], num_workers: int | None,
                  mp_context: str | None, options: dict[str, Any],
                  timeouts: tuple[float | None, float | None], start_timeout: float, *,
                  fallback: bool = True) -> Backend:
    """The backend ``name`` over ``builds``, started with the pool's deadlines
    ``(step_timeout, reset_timeout)``; if it cannot start and ``fallback`` is set, the
    sequential backend instead, with a logged warning naming the cause. `EnvBuildError` (the
    envs, not the backend, are broken) is never a reason to fall back."""
    backend: Backend | None = None
    try:
        backend = get_backend(name)(builds, num_workers, mp_context=mp_context, **options)
        backend.step_timeout, backend.reset_timeout = timeouts
        backend.start(start_timeout)
        return backend
    except (BackendUnavailable, OSError, ImportError) as exc:
        if backend is not None:
            backend.close()
        if not fallback or name == "sequential":
            raise
        log.warning("backend %r cannot start (%s); falling back to sequential", name,
                    short_error(exc))
    return start_backend("sequential", builds, 1, None, {}, timeouts, start_timeout,
                         fallback=False)


__all__ = ["BACKENDS", "LOCAL_BACKENDS", "Backend", "BackendUnavailable", "get_backend",
           "start_backend"]
