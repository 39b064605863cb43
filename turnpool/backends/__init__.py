"""Backends: where the pool's envs run. One file per backend, all behind `base.Backend`.

Backends are looked up by name and imported lazily, so optional dependencies (ray, joblib) are
only imported when chosen, and the pool never imports a concrete backend module.
"""

from __future__ import annotations

import importlib

from turnpool.backends.base import Backend, BackendUnavailable

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

#: Backends that the equivalence tests run over (every one that works on this machine).
#: ray is checked in its own test module, which owns the Ray runtime for its duration.
ALL_BACKENDS: list[str] = ["sequential", "thread", "process", "process_pool", "joblib", "auto"]


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


__all__ = ["ALL_BACKENDS", "BACKENDS", "Backend", "BackendUnavailable", "get_backend"]
