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
process with other threads (prefer the sequential or a process backend for them).
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
import importlib
import inspect
from typing import Any

import numpy as np

from turnpool.envs.base import TextEnv
from turnpool.envs.frames import INFO_KEY, FrameDesc, FrameSlot

#: The observation text of a frame (RAGEN's rollout cache writes one per image).
IMAGE_PLACEHOLDER = "<images>"


def ragen_registry() -> tuple[dict[str, Any], dict[str, Any]] | None:
    """RAGEN's ``(REGISTERED_ENVS, REGISTERED_ENV_CONFIGS)``, or None when not importable."""
    try:
        module = importlib.import_module("ragen.env")
    except ImportError:
        return None
    envs = getattr(module, "REGISTERED_ENVS", None)
    configs = getattr(module, "REGISTERED_ENV_CONFIGS", None)
    if not isinstance(envs, dict):
        return None
    return envs, configs if isinstance(configs, dict) else {}


def resolve_ragen(name_or_entry_point: str) -> tuple[type[TextEnv], dict[str, Any]] | None:
    """`RagenEnvAdapter` and its kwargs for a RAGEN-registered name, else None."""
    found = ragen_registry()
    if found is None or name_or_entry_point not in found[0]:
        return None
    return RagenEnvAdapter, {"ragen_env": name_or_entry_point}


def is_ragen_style(cls: Any) -> bool:
    """A class that is not a `TextEnv` but has ``reset`` and ``step``: RAGEN's shape."""
    return (inspect.isclass(cls) and not issubclass(cls, TextEnv)
            and callable(getattr(cls, "reset", None)) and callable(getattr(cls, "step", None)))


def _load(entry: str) -> Any:
    module_name, _, attr = entry.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def _config_class(ragen_env: str) -> Any:
    """The RAGEN config dataclass an env is built with, or None."""
    if ":" in ragen_env:
        cls = _load(ragen_env)
        config_cls = getattr(cls, "config_class", None)
        if config_cls is None:
            module = importlib.import_module(cls.__module__)
            configs = getattr(module, "REGISTERED_ENV_CONFIGS", {}) or {}
            envs = getattr(module, "REGISTERED_ENVS", {}) or {}
            names = [n for n, c in envs.items() if c is cls]
            config_cls = configs.get(names[0]) if names else None
        return config_cls
    found = ragen_registry()
    return None if found is None else found[1].get(ragen_env)


def _build(ragen_env: str, kwargs: dict[str, Any]) -> Any:
    """Construct the wrapped env as RAGEN's manager does."""
    config_cls = _config_class(ragen_env)
    if ":" in ragen_env:
        cls = _load(ragen_env)
        return cls(config_cls(**kwargs)) if config_cls is not None else cls(**kwargs)
    found = ragen_registry()
    if found is None or ragen_env not in found[0]:
        raise KeyError(f"{ragen_env!r} is not in ragen.env.REGISTERED_ENVS")
    return found[0][ragen_env](config_cls(**kwargs) if config_cls else None)


class RagenEnvAdapter(TextEnv):
    """A RAGEN env as a `TextEnv` (see the module docstring)."""

    metadata = {"render_modes": ["text", "rgb_array"]}

    @staticmethod
    def effective_config(kwargs: dict[str, Any]) -> dict[str, Any]:
        """The wrapped env's config as RAGEN builds it (its dataclass defaults overlaid with
        ``kwargs``): what RAGEN's manager reads ``action_lookup`` from."""
        config_cls: Any = _config_class(str(kwargs.get("ragen_env", "")))
        rest = {k: v for k, v in kwargs.items() if k not in ("ragen_env", "reset_mode")}
        if not isinstance(config_cls, type) or not dataclasses.is_dataclass(config_cls):
            return dict(kwargs)
        return {**dataclasses.asdict(config_cls(**rest)), "ragen_env": kwargs["ragen_env"]}

    def __init__(self, ragen_env: str, reset_mode: str = "train", **env_config: Any) -> None:
        super().__init__(ragen_env=ragen_env, **env_config)
        self.reset_mode = reset_mode  # the manager's mode, passed to the wrapped env's reset
        self.inner = _build(ragen_env, dict(env_config))
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
        self._obs = self._text(obs)
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
        config = getattr(self.inner, "config", None)
        lookup = getattr(config, "action_lookup", None)
        if lookup is None:
            lookup = getattr(self.inner, "ACTION_LOOKUP", None)
        return {int(k): str(v) for k, v in dict(lookup).items()} if lookup else None

    def get_state(self) -> Any:
        raise NotImplementedError("RAGEN envs are reset per member, not copied")

    def close(self) -> None:
        self._slot.close()
        close = getattr(self.inner, "close", None)
        if callable(close):
            close()


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
