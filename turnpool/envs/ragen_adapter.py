"""RAGEN env classes on turnpool: the adapter behind ``REGISTERED_ENVS`` names and entry points.

A RAGEN env (``ragen.env.base.BaseEnv`` style) is built from a config object
(``REGISTERED_ENV_CONFIGS[name](**env_config)``), its ``reset(seed, mode)`` returns only the
observation and its ``step(action)`` returns gym's 4-tuple ``(obs, reward, done, info)``.
`RagenEnvAdapter` wraps one so it is a `turnpool.envs.base.TextEnv`: the pool, every backend
(workers rebuild it from its name, spawn and Ray included) and the RAGEN facade run it as they
run turnpool's own envs.

Two ways in, both through `turnpool.envs.registry.resolve`:

* a name that turnpool does not register but RAGEN's ``ragen.env.REGISTERED_ENVS`` does
  (when ``ragen`` is importable): built with ``REGISTERED_ENV_CONFIGS[name]``;
* an entry point ``"pkg.mod:Class"`` naming a class that is not a ``TextEnv``: built with
  ``Class.config_class`` (or the module's ``REGISTERED_ENV_CONFIGS`` entry for it) when there
  is one, else with the keyword arguments themselves.

Image observations (``rgb_array`` envs) reach the driver through shared memory
(`turnpool.envs.frames`): the text is ``"<images>"`` and ``info["frame_shm"]`` names the block.

The wrapped env keeps its own rules, including its random streams: RAGEN's envs seed the
process-global RNGs, so they are deterministic per seed in any process but must not share a
process with other threads. `uses_global_rng` probes for that (the class's package source
calls ``random.seed`` / ``np.random.seed`` / ``all_seed``), and the thread backend refuses such
envs (the pool then runs them sequentially). RAGEN v2's gymnasium-style ``reset`` (2048
returns ``(obs, info)``) is read as its observation. RAGEN v2's env types that turnpool runs
only through this adapter (`ADAPTER_ONLY`: lean, alfworld, spatial, static) fail with a
one-line `MissingRagenEnv` naming what they need when RAGEN's code is not importable.
``get_state`` is not offered, so each member of a group is reset with the group seed (what
RAGEN does) rather than copied.

Example:
    >>> from turnpool.envs.registry import make
    >>> env = make("turnpool.envs.ragen_adapter:_DemoRagenEnv")
    >>> env.reset(seed=3)[0]
    'count 3'
    >>> env.step("add")[:3]
    ('count 4', 1.0, True)
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import re
import sys
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from turnpool.envs.base import TextEnv
from turnpool.envs.entry import load_entry_point
from turnpool.envs.frames import INFO_KEY, FrameDesc, FrameSlot
from turnpool.extras import MissingExtra

#: The observation text of a frame (RAGEN's rollout cache writes one per image).
IMAGE_PLACEHOLDER = "<images>"


#: RAGEN v2 env types that turnpool runs only through this adapter, and what each needs
#: besides RAGEN's own code (importable as ``ragen``).
ADAPTER_ONLY: dict[str, str] = {
    "lean": "kimina_client (kimina-client) and a Kimina Lean server",
    "alfworld": "alfworld and textworld, with the ALFWorld data (alfworld-download)",
    "spatial": "RAGEN's ragen/env/spatial/Base submodule (git submodule update --init)",
    "static": "datasets (the Hugging Face data sets it loads)",
}


class MissingRagenEnv(MissingExtra):
    """A RAGEN env type that needs RAGEN's code or its packages; ``str(e)`` is one line."""

    def __init__(self, env_type: str, reason: str) -> None:
        ImportError.__init__(self, f"env {env_type!r} runs RAGEN's own class: {reason}",
                             name="ragen")
        self.module, self.feature, self.extra = "ragen", f"env {env_type!r}", "ragen"


@runtime_checkable
class RagenStyle(Protocol):
    """What a RAGEN env class offers: ``reset`` and ``step``."""

    def reset(self, *args: Any, **kwargs: Any) -> Any: ...

    def step(self, action: Any) -> Any: ...


@runtime_checkable
class _Closable(Protocol):
    def close(self) -> Any: ...


def ragen_registry() -> tuple[dict[str, Any], dict[str, Any]] | None:
    """RAGEN's ``(REGISTERED_ENVS, REGISTERED_ENV_CONFIGS)``, or None when not importable."""
    try:
        from ragen.env import (  # type: ignore[import-not-found]
            REGISTERED_ENV_CONFIGS,
            REGISTERED_ENVS,
        )
    except ImportError:
        return None
    return dict(REGISTERED_ENVS), dict(REGISTERED_ENV_CONFIGS)


def resolve_ragen(name_or_entry_point: str) -> tuple[type[TextEnv], dict[str, Any]] | None:
    """`RagenEnvAdapter` and its kwargs for a RAGEN-registered name, else None; for RAGEN v2's
    adapter-only types (`ADAPTER_ONLY`) a `MissingRagenEnv` naming what is missing."""
    found = ragen_registry()
    if found is not None and name_or_entry_point in found[0]:
        return RagenEnvAdapter, {"ragen_env": name_or_entry_point}
    needs = ADAPTER_ONLY.get(name_or_entry_point)
    if needs is None:
        return None
    if found is None:
        raise MissingRagenEnv(name_or_entry_point,
                              f"install RAGEN (importable as ragen) and {needs}")
    raise MissingRagenEnv(name_or_entry_point, f"RAGEN is installed but does not register "
                                               f"it; it needs {needs}")


def is_ragen_style(cls: Any) -> bool:
    """A class that is not a `TextEnv` but has ``reset`` and ``step``: RAGEN's shape."""
    return inspect.isclass(cls) and not issubclass(cls, TextEnv) and issubclass(cls, RagenStyle)


def _registries_of(module_name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A module's own ``(REGISTERED_ENVS, REGISTERED_ENV_CONFIGS)`` (empty when it has none),
    read from its namespace."""
    namespace = vars(importlib.import_module(module_name))
    envs, configs = namespace.get("REGISTERED_ENVS"), namespace.get("REGISTERED_ENV_CONFIGS")
    return (envs if isinstance(envs, dict) else {}), (configs if isinstance(configs, dict)
                                                      else {})


def _config_class(ragen_env: str) -> Any:
    """The RAGEN config dataclass an env is built with, or None: the class's own
    ``config_class``, else the config its module's registry (or RAGEN's) pairs with it."""
    found = ragen_registry()
    if ":" not in ragen_env:
        return None if found is None else found[1].get(ragen_env)
    cls = load_entry_point(ragen_env)
    # an optional attribute of a class turnpool does not own (no base class to declare it)
    config_cls = getattr(cls, "config_class", None)
    for envs, configs in (_registries_of(cls.__module__), found or ({}, {})):
        names = [n for n, c in envs.items() if c is cls]
        if config_cls is None and names:
            config_cls = configs.get(names[0])
    return config_cls


def _build(ragen_env: str, kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """``(env, config)``: the wrapped env constructed as RAGEN's manager does, and the config
    object it was given (None when built from keyword arguments)."""
    config_cls = _config_class(ragen_env)
    config = config_cls(**kwargs) if config_cls is not None else None
    if ":" in ragen_env:
        cls = load_entry_point(ragen_env)
        return (cls(config) if config is not None else cls(**kwargs)), config
    found = ragen_registry()
    if found is None or ragen_env not in found[0]:
        raise KeyError(f"{ragen_env!r} is not in ragen.env.REGISTERED_ENVS")
    return found[0][ragen_env](config), config


#: What seeds or reseeds the process-global RNGs in a module's source.
_GLOBAL_SEEDING = re.compile(r"\b(?:random\.seed|np\.random\.seed|numpy\.random\.seed|all_seed)\(")


@functools.lru_cache(maxsize=64)
def _folder_seeds_globally(folder: str) -> bool:
    """Whether any module in a package folder seeds the process-global RNGs."""
    for path in sorted(Path(folder).glob("*.py")):
        try:
            if _GLOBAL_SEEDING.search(path.read_text(encoding="utf-8", errors="replace")):
                return True
        except OSError:
            continue
    return False


def uses_global_rng(ragen_env: str) -> bool:
    """Probe: does this RAGEN env class (or a module beside one of its classes' modules, such
    as RAGEN Sudoku's ``utils``) seed the process-global RNG? Such envs are deterministic per
    seed only while no other thread of the process draws in between."""
    if ":" in ragen_env:
        cls = load_entry_point(ragen_env)
    else:
        found = ragen_registry()
        if found is None or ragen_env not in found[0]:
            return False
        cls = found[0][ragen_env]
    for klass in inspect.getmro(cls):
        module = sys.modules.get(klass.__module__)
        try:
            source = inspect.getsourcefile(module) if module is not None else None
        except TypeError:  # a built-in module: no source, draws nothing of its own
            continue
        if source and _folder_seeds_globally(str(Path(source).parent)):
            return True
    return False


def _observation(obs: Any) -> Any:
    """The observation of a reset: RAGEN v2's gymnasium-style envs (2048) return
    ``(obs, info)``."""
    if isinstance(obs, tuple) and len(obs) == 2 and isinstance(obs[1], dict):
        return obs[0]
    return obs


class RagenEnvAdapter(TextEnv):
    """A RAGEN env as a `TextEnv` (see the module docstring)."""

    metadata = {"render_modes": ["text", "rgb_array"]}

    def __init__(self, ragen_env: str, reset_mode: str = "train", **env_config: Any) -> None:
        super().__init__(ragen_env=ragen_env, **env_config)
        self.reset_mode = reset_mode  # the manager's mode, passed to the wrapped env's reset
        self.inner, self._config = _build(ragen_env, dict(env_config))
        self.frame: np.ndarray | None = None
        self._slot = FrameSlot()
        self._frame_desc: FrameDesc | None = None
        self._obs = ""

    # ------------------------------------------------------------------ RAGEN -> TextEnv
    def _text(self, obs: Any) -> str:
        """The observation as text; an image becomes ``"<images>"`` and goes to this env's
        shared-memory frame slot (its descriptor rides in ``info``)."""
        self.frame, self._frame_desc = None, None
        if isinstance(obs, str):
            return obs
        if isinstance(obs, (list, tuple)) and obs and all(isinstance(o, np.ndarray) for o in obs):
            obs = obs[0]  # RAGEN's envs return one frame; the first of several is carried
        if isinstance(obs, np.ndarray):
            self.frame = obs
            self._frame_desc = self._slot.write(obs)
            return IMAGE_PLACEHOLDER
        return str(obs)

    def _reset(self, seed: int, options: dict[str, Any]) -> str:
        try:
            obs = self.inner.reset(seed=seed, mode=options.get("mode", self.reset_mode))
        except TypeError:
            obs = self.inner.reset(seed=seed)
        self._obs = self._text(_observation(obs))
        return self._obs

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        out = self.inner.step(action)
        if len(out) == 5:  # a gymnasium-style env slipped in: accept it too
            obs, reward, terminated, truncated, info = out
        else:
            obs, reward, done, info = out
            terminated, truncated = bool(done), False
        self._obs = self._text(obs)
        return self._obs, reward, terminated, truncated, dict(info or {})

    def _info(self, info: dict[str, Any]) -> dict[str, Any]:
        # The wrapped env's own keys only (RAGEN's metrics average every key it reports).
        out = dict(info)
        out["anchor_obs"] = self.anchor_obs()
        if self._frame_desc is not None:
            out[INFO_KEY] = self._frame_desc
        return out

    def _render_text(self) -> str:
        return self._obs

    def render(self, mode: str | None = None) -> Any:
        if mode == "rgb_array" or (mode is None and self.frame is not None):
            rendered = self.inner.render()
            return rendered if isinstance(rendered, np.ndarray) else self.frame
        return self._obs

    def action_lookup_for_episode(self) -> dict[int, str] | None:
        # RAGEN's manager reads the env config's action_lookup (Bandit fills it per reset);
        # an optional field of a config dataclass turnpool does not own
        lookup = getattr(self._config, "action_lookup", None)
        return {int(k): str(v) for k, v in dict(lookup).items()} if lookup else None

    def get_state(self) -> Any:
        raise NotImplementedError("RAGEN envs are reset per member, not copied")

    def close(self) -> None:
        self._slot.close()
        if isinstance(self.inner, _Closable):
            self.inner.close()


def effective_config(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The wrapped env's config as RAGEN builds it (its dataclass defaults overlaid with
    ``kwargs``): what RAGEN's manager reads ``action_lookup`` from."""
    config_cls: Any = _config_class(str(kwargs.get("ragen_env", "")))
    rest = {k: v for k, v in kwargs.items() if k not in ("ragen_env", "reset_mode")}
    if not isinstance(config_cls, type) or not dataclasses.is_dataclass(config_cls):
        return dict(kwargs)
    return {**dataclasses.asdict(config_cls(**rest)), "ragen_env": kwargs["ragen_env"]}


RagenEnvAdapter.effective_config = staticmethod(effective_config)


@dataclasses.dataclass
class _DemoConfig:
    start: int = 0


class _DemoRagenEnv:
    """A minimal RAGEN-style env (for the docstring example)."""

    config_class = _DemoConfig

    def __init__(self, config: _DemoConfig | None = None) -> None:
        self.config = config or _DemoConfig()
        self.count = 0

    def reset(self, seed: int | None = None, mode: str | None = None) -> str:
        self.count = self.config.start + int(seed or 0)
        return f"count {self.count}"

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        self.count += 1
        return f"count {self.count}", 1.0, True, {"success": True}
