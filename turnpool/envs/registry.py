"""Name -> env class registry with gymnasium-style ``"module.path:ClassName"`` entry points.

Workers in other processes rebuild envs from ``(name_or_entry_point, kwargs)``, so a user env
registered by entry point works on every backend, including spawn and Ray.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from turnpool.envs.base import ACTION_KINDS, OracleFn, TextEnv


@dataclass(frozen=True)
class EnvSpec:
    """A registered env: its entry point and default keyword arguments."""

    name: str
    entry_point: str
    kwargs: dict[str, Any] = field(default_factory=dict)


_REGISTRY: dict[str, EnvSpec] = {}


def register(name: str, entry_point: str, **kwargs: Any) -> None:
    """Register ``name`` -> ``"module.path:ClassName"``; re-registering replaces the entry."""
    if ":" not in entry_point:
        raise ValueError(f"entry_point must look like 'module.path:ClassName', got {entry_point!r}")
    _REGISTRY[name] = EnvSpec(name, entry_point, dict(kwargs))


def registered() -> dict[str, EnvSpec]:
    """A copy of the registry (name -> spec)."""
    return dict(_REGISTRY)


def resolve(name_or_entry_point: str) -> tuple[type[TextEnv], dict[str, Any]]:
    """The env class and default kwargs for a registered name or an entry point string."""
    from turnpool.envs import ragen_adapter  # RAGEN env classes and REGISTERED_ENVS names

    spec = _REGISTRY.get(name_or_entry_point)
    entry = spec.entry_point if spec else name_or_entry_point
    if ":" not in entry:
        found = ragen_adapter.resolve_ragen(entry)
        if found is not None:
            return found
        known = ", ".join(sorted(_REGISTRY))
        raise KeyError(f"unknown env {name_or_entry_point!r}; registered: {known}")
    module_name, _, attr = entry.partition(":")
    cls = getattr(importlib.import_module(module_name), attr)
    if ragen_adapter.is_ragen_style(cls):
        return ragen_adapter.RagenEnvAdapter, {"ragen_env": entry, **(spec.kwargs if spec else {})}
    return cls, dict(spec.kwargs) if spec else {}


def action_kind(name_or_entry_point: str) -> str:
    """The env's declared ``action_kind`` (see `turnpool.envs.base.ACTION_KINDS`), or the
    one its ``action_lookup`` implies when it declares none."""
    cls, _ = resolve(name_or_entry_point)
    kind = cls.action_kind
    if kind is None:
        if not cls.action_lookup:
            return "free_text"
        per_episode = cls.action_lookup_for_episode is not TextEnv.action_lookup_for_episode
        return "names" if per_episode else "discrete"
    if kind not in ACTION_KINDS:
        raise ValueError(f"{cls.__name__}.action_kind {kind!r} is not one of {ACTION_KINDS}")
    return kind


def oracle_for(name_or_entry_point: str) -> OracleFn:
    """The env class's declared ``oracle``; `LookupError` when it has none."""
    cls, _ = resolve(name_or_entry_point)
    if cls.oracle is None:
        raise LookupError(f"env {name_or_entry_point!r} ({cls.__name__}) declares no oracle")
    return cls.oracle


def make(name_or_entry_point: str, **kwargs: Any) -> TextEnv:
    """Build an env from a registered name or ``"module.path:ClassName"``."""
    cls, defaults = resolve(name_or_entry_point)
    return cls(**{**defaults, **kwargs})


for _name, _entry in {
    "sokoban": "turnpool.envs.sokoban:SokobanEnv",
    "frozen_lake": "turnpool.envs.frozen_lake:FrozenLakeEnv",
    "bandit": "turnpool.envs.bandit:BanditEnv",
    "countdown": "turnpool.envs.countdown:CountdownEnv",
    "metamathqa": "turnpool.envs.metamathqa:MetaMathQAEnv",
    "webshop": "turnpool.envs.webshop:WebShopEnv",
}.items():
    register(_name, _entry)

for _name, _cls in {"trivial": "TrivialEnv", "cpu": "CpuEnv", "sleep": "SleepEnv",
                    "faulty": "FaultyEnv"}.items():
    register(_name, f"turnpool.envs.synthetic:{_cls}")
