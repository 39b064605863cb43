"""Name -> env class registry with gymnasium-style ``"module.path:ClassName"`` entry points.

Workers in other processes rebuild envs from ``(name_or_entry_point, kwargs)``, so a user env
registered by entry point works on every backend, including spawn and Ray.

What names an env (`make`, ``EnvPool(env_type=...)``), tried in this order: a library's id
behind its hub prefix (``"gem:game:Sokoban-v0-easy"``, ``"rg:leg_counting"``: the table
`turnpool.envs.hub_table.HUBS`), a registered name, a gymnasium id (``"FrozenLake-v1"``, wrapped
in `turnpool.envs.gym_adapter.GymTextEnv`), an entry point ``"module.path:Name"``, or a
callable factory returning a `TextEnv` or a gymnasium env. `build_target` reduces each to an
entry point string + kwargs, the form workers rebuild from.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FunctionType, MethodType
from typing import Any

from gymnasium.envs.registration import EnvSpec as GymEnvSpec

import turnpool.envs.hub_table as hub_table
from turnpool.envs.base import ACTION_KINDS, OracleFn, TextEnv
from turnpool.envs.entry import load_entry_point


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


def _squash(name: str) -> str:
    return re.sub(r"[\s_-]", "", name).lower()


def _spec_of(name: str) -> EnvSpec | None:
    """The registered spec for ``name`` or for an alias of it: the same name without ``_``,
    ``-`` or blanks, in any case (RAGEN writes ``frozenlake``, ``FrozenLake``); ``None`` when
    nothing, or more than one name, matches."""
    spec = _REGISTRY.get(name)
    if spec is not None or ":" in name:
        return spec
    wanted = _squash(name)
    matches = [s for key, s in _REGISTRY.items() if _squash(key) == wanted]
    return matches[0] if len(matches) == 1 else None


def resolve(name_or_entry_point: str) -> tuple[type[TextEnv], dict[str, Any]]:
    """The env class and default kwargs for a registered name (or alias) or an entry point
    string; RAGEN env classes and ``REGISTERED_ENVS`` names go through the RAGEN adapter."""
    import turnpool.envs.ragen_adapter as ragen_adapter

    library_env = hub_table.split(name_or_entry_point)
    if library_env is not None:
        return load_entry_point(library_env[0].entry_point), {"env_id": library_env[1]}
    spec = _spec_of(name_or_entry_point)
    entry = spec.entry_point if spec else name_or_entry_point
    if ":" not in entry:
        found = ragen_adapter.resolve_ragen(entry)
        if found is not None:
            return found
        known = ", ".join(sorted(_REGISTRY))
        raise KeyError(f"unknown env {name_or_entry_point!r}; registered: {known}")
    cls = load_entry_point(entry)
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


def draws_from_global_rng(name_or_entry_point: str, kwargs: dict[str, Any]) -> str | None:
    """The env's class name when it draws from the process-global RNG (its class says so, or
    for a RAGEN class the adapter's probe finds it seeding that RNG), else None. Threads of one
    process must not run such envs side by side."""
    return _global_rng_user(name_or_entry_point, str(kwargs.get("ragen_env") or ""))


@functools.lru_cache(maxsize=256)
def _global_rng_user(name_or_entry_point: str, ragen_env: str) -> str | None:
    """`draws_from_global_rng` for one (entry point, wrapped RAGEN env), cached: a pool asks
    once per env."""
    import turnpool.envs.ragen_adapter as ragen_adapter

    try:
        cls, defaults = resolve(name_or_entry_point)
        if cls is ragen_adapter.RagenEnvAdapter:
            inner = ragen_env or str(defaults.get("ragen_env", ""))
            return inner if ragen_adapter.uses_global_rng(inner) else None
    except (KeyError, ImportError, AttributeError):  # not buildable: the build will say why
        return None
    if isinstance(cls, type) and issubclass(cls, TextEnv) and cls.uses_global_rng:
        return cls.__name__
    return None


def oracle_for(name_or_entry_point: str) -> OracleFn:
    """The env class's declared ``oracle``; `LookupError` when it has none."""
    cls, _ = resolve(name_or_entry_point)
    if cls.oracle is None:
        raise LookupError(f"env {name_or_entry_point!r} ({cls.__name__}) declares no oracle")
    return cls.oracle


#: The entry points `build_target` gives gymnasium ids and factories.
GYM_ENTRY_POINT = "turnpool.envs.gym_adapter:GymTextEnv"
FACTORY_ENTRY_POINT = "turnpool.envs.gym_adapter:from_factory"

EnvTarget = str | Callable[..., Any]


def is_gym_id(name: str) -> bool:
    """Is ``name`` a gymnasium id (and not a turnpool name)?"""
    if name in _REGISTRY:
        return False
    from gymnasium.envs.registration import registry as gym_registry

    return name in gym_registry


def build_target(env: EnvTarget, kwargs: dict[str, Any] | None = None
                 ) -> tuple[str, dict[str, Any]]:
    """``(entry point, kwargs)`` that build ``env`` in any process (see the module doc).

    Registered names resolve to their entry point with their default kwargs merged in, so
    envs registered only in this process still build in spawned workers. The target is
    imported here, so a typo fails in the caller, not in a worker.
    """
    kwargs = dict(kwargs or {})
    if callable(env):
        return FACTORY_ENTRY_POINT, {"factory": env, **kwargs}
    if not isinstance(env, str):
        raise TypeError(f"an env is a name, an entry point, a gymnasium id or a callable, "
                        f"got {type(env).__name__}")
    found = hub_table.split(env)
    if found is not None:
        return _hub_target(*found, kwargs)
    spec = _REGISTRY.get(env)
    if spec is None and is_gym_id(env):
        return GYM_ENTRY_POINT, {"gym_id": env, **kwargs}
    spec = spec or _spec_of(env)
    if spec is not None:
        resolve(spec.entry_point)
        return spec.entry_point, {**spec.kwargs, **kwargs}
    resolve(env)
    return env, kwargs


def _hub_target(hub: hub_table.Hub, env_id: str, kwargs: dict[str, Any]
                ) -> tuple[str, dict[str, Any]]:
    """A library's env: its adapter's entry point with ``env_id``, checked here (the library
    installed, the id one it offers) so that a missing extra or a typo fails in the caller."""
    hub.require()
    with hub_table.GlobalRngScope():  # a library's registry may draw on first read
        load_entry_point(hub.entry_point).check_id(env_id)
    return hub.entry_point, {**kwargs, "env_id": env_id}


def target_name(env: EnvTarget) -> str:
    """A short readable name for an env target (a class's or function's qualified name, else
    the name of the callable's type)."""
    if isinstance(env, str):
        return env
    if isinstance(env, type | FunctionType | MethodType):
        return env.__qualname__
    return type(env).__name__


def make(name_or_entry_point: EnvTarget, **kwargs: Any) -> TextEnv:
    """Build an env from a registered name, a gymnasium id, ``"module.path:ClassName"`` or a
    factory callable; the env's ``spec`` says how to build it again (gymnasium's `EnvSpec`)."""
    entry, merged = build_target(name_or_entry_point, kwargs)
    cls, defaults = resolve(entry)  # an adapter's own kwargs (RAGEN classes)
    merged = {**defaults, **merged}
    env = cls(**merged)
    if isinstance(env, TextEnv) and env.spec is None and not callable(name_or_entry_point):
        label = re.sub(r"[^\w.-]", ".", target_name(name_or_entry_point))
        env.spec = GymEnvSpec(id=f"turnpool/{label}", entry_point=entry, kwargs=merged)
    return env


for _name, _entry in {
    "sokoban": "turnpool.envs.sokoban:SokobanEnv",
    "frozen_lake": "turnpool.envs.frozen_lake:FrozenLakeEnv",
    "bandit": "turnpool.envs.bandit:BanditEnv",
    "countdown": "turnpool.envs.countdown:CountdownEnv",
    "deepcoder": "turnpool.envs.deepcoder:DeepCoderEnv",
    "metamathqa": "turnpool.envs.metamathqa:MetaMathQAEnv",
    "webshop": "turnpool.envs.webshop_ragen:RagenWebShopEnv",
    "webshop_lite": "turnpool.envs.webshop:WebShopEnv",
    "sudoku": "turnpool.envs.sudoku:SudokuEnv",
    "game_2048": "turnpool.envs.game_2048:Game2048Env",
    "rubikscube": "turnpool.envs.rubikscube:RubiksCube2x2Env",
    "search": "turnpool.envs.search_qa:SearchQAEnv",
}.items():
    register(_name, _entry)

for _name, _cls in {"trivial": "TrivialEnv", "cpu": "CpuEnv", "sleep": "SleepEnv",
                    "faulty": "FaultyEnv"}.items():
    register(_name, f"turnpool.envs.synthetic:{_cls}")
