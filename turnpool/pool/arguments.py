"""Strict arguments of `turnpool.pool.api.EnvPool`: a typo or a bad value fails at once,
naming the parameter (and the closest valid name)."""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from turnpool.backends import BACKENDS, get_backend
from turnpool.envs.registry import EnvTarget
from turnpool.worker.errors import BackendUnavailable


class GroupSpec(Protocol):
    """What the checks read of an `turnpool.pool.api.EnvGroupSpec`."""

    @property
    def tag(self) -> str: ...
    @property
    def env_type(self) -> EnvTarget: ...
    @property
    def n_groups(self) -> int: ...
    @property
    def env_kwargs(self) -> dict[str, Any]: ...


def check_int(name: str, value: Any, minimum: int | None = None, none_ok: bool = False
               ) -> None:
    if value is None and none_ok:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int{' or None' if none_ok else ''}, "
                        f"got {type(value).__name__} {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def check_seconds(name: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds or None, "
                        f"got {type(value).__name__} {value!r}")
    if not value > 0 or math.isnan(value):
        raise ValueError(f"{name} must be > 0 seconds (or None for no deadline), got {value}")


def _option_names(backend: str) -> set[str]:
    """Keyword options a backend's constructor takes (auto: those of every backend, since
    it hands them to the one it picks)."""
    names: set[str] = set()
    for key in (BACKENDS if backend == "auto" else [backend]):
        try:
            cls = get_backend(key)
        except (BackendUnavailable, ValueError):
            continue
        for klass in cls.__mro__:
            init = klass.__dict__.get("__init__")
            if init is None:
                continue
            for p in inspect.signature(init).parameters.values():
                if p.kind == p.KEYWORD_ONLY:
                    names.add(p.name)
    return names - {"mp_context"}


def check_arguments(pool_init: Callable[..., Any], specs: Sequence[GroupSpec], group_n: Any,
                    seed: Any, backend: Any, num_workers: Any, mp_context: Any,
                    step_timeout: Any, reset_timeout: Any, on_error: Any,
                    options: dict[str, Any]) -> None:
    """Strict arguments: a typo or a bad value fails here, naming the parameter."""
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str, got {type(backend).__name__} {backend!r}")
    if backend not in BACKENDS:
        close = difflib.get_close_matches(backend, list(BACKENDS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown backend {backend!r} (one of {', '.join(BACKENDS)}){hint}")
    known = _option_names(backend)
    unknown = sorted(set(options) - known)
    if unknown:
        params = set(inspect.signature(pool_init).parameters) - {
            "self", "backend_options", "specs"}
        candidates = sorted(params | _option_names("auto"))
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
            if not close:
                close = [c for c in candidates if c.replace("_", "") == key.lower()]
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise TypeError(f"EnvPool() got unexpected keyword argument(s) {', '.join(hints)} "
                        f"for backend {backend!r}")
    check_int("group_n", group_n, 1)
    check_int("seed", seed, 0)
    check_int("num_workers", num_workers, 1, none_ok=True)
    check_seconds("step_timeout", step_timeout)
    check_seconds("reset_timeout", reset_timeout)
    if mp_context is not None and not isinstance(mp_context, str):
        raise TypeError(f"mp_context must be a str or None, got {type(mp_context).__name__}")
    if on_error not in ("flag", "raise"):
        raise ValueError(f"on_error must be 'flag' or 'raise', got {on_error!r}")
    for spec in specs:
        if not (isinstance(spec.env_type, str) or callable(spec.env_type)):
            raise TypeError(f"env_type must be a str (a registered name, 'module:Class' or a "
                            f"gymnasium id) or an env factory, got "
                            f"{type(spec.env_type).__name__}")
        if not isinstance(spec.env_kwargs, Mapping):
            raise TypeError(f"env_kwargs must be a dict, got {type(spec.env_kwargs).__name__}")
        check_int(f"env_num (n_groups of tag {spec.tag!r})", spec.n_groups, 0)

