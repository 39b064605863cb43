"""Any gymnasium env as a turnpool text env, so gymnasium's own envs run in an `EnvPool`.

turnpool's pool, rollouts and prompts speak text; gymnasium envs return numbers, tuples and
arrays. `GymTextEnv` wraps one gymnasium env and writes each observation as text with
`obs_to_text` (the value as a Python literal: ``5`` -> ``"5"``, Blackjack's
``(14, 10, 0)`` -> ``"(14, 10, 0)"``, arrays as nested lists), or with the ``obs_to_text``
callable given to it; an env whose observation space is already a ``Text`` keeps that space.
Actions: a ``Discrete`` space takes its ids (ints, or the same ids as text, ``"2"``); other
spaces take whatever their ``contains`` accepts. Anything else is
``action_is_valid=False`` with no step taken, as for every turnpool env. ``success`` is "the
episode terminated with a positive reward".

The wrapped env is seeded by the wrapper's reset seed, so a gymnasium env is as deterministic
in a pool as a built-in one: same seed and actions, same results on every backend.

Example:
    >>> env = GymTextEnv("FrozenLake-v1", is_slippery=False)
    >>> env.reset(seed=0)[0]
    '0'
    >>> obs, reward, terminated, truncated, info = env.step(2)   # 2 = right
    >>> obs, info["action_is_valid"], env.step("up")[4]["action_is_valid"]
    ('1', True, False)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from turnpool.envs.base import TextEnv


def obs_to_text(obs: Any) -> str:
    """A gymnasium observation as text: the value as a Python literal, numpy values as plain
    Python numbers, arrays as nested lists, tuples and dicts element by element."""
    if isinstance(obs, str):
        return obs
    if isinstance(obs, np.ndarray):
        return repr(obs.tolist())
    if isinstance(obs, np.generic):
        return repr(obs.item())
    if isinstance(obs, tuple):
        inner = ", ".join(obs_to_text(x) for x in obs)
        return f"({inner},)" if len(obs) == 1 else f"({inner})"
    if isinstance(obs, dict):
        return "{" + ", ".join(f"{k!r}: {obs_to_text(v)}" for k, v in obs.items()) + "}"
    return repr(obs)


def _plain(value: Any) -> Any:
    """numpy values in an info dict as plain Python (picklable, comparable with ``==``)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


class GymTextEnv(TextEnv):
    """A gymnasium env (by id, or an instance) with text observations; see the module doc.

    Args:
        gym_id: a gymnasium id (``"FrozenLake-v1"``); ``**gym_kwargs`` go to ``gymnasium.make``.
        env: an already built gymnasium env instead of an id (what factories return).
        obs_to_text: observation -> text (default: `obs_to_text`); must be picklable to cross
            processes.
    """

    #: the wrapped env's internals are not ours to copy: branch by seed + action replay
    snapshot_by_state = False

    def __init__(self, gym_id: str | None = None, *, env: gymnasium.Env[Any, Any] | None = None,
                 obs_to_text: Callable[[Any], str] | None = None, **gym_kwargs: Any) -> None:
        render_mode = gym_kwargs.pop("render_mode", None)
        super().__init__(gym_id=gym_id, render_mode=render_mode, **gym_kwargs)
        if (gym_id is None) == (env is None):
            raise ValueError("give exactly one of gym_id and env")
        if env is None:
            env = gymnasium.make(str(gym_id), disable_env_checker=True, **gym_kwargs)
        self.env = env
        self.action_space = env.action_space
        if obs_to_text is None and isinstance(env.observation_space, spaces.Text):
            # its observations are already text: they keep the env's own space (its charset
            # and lengths), as gymnasium's vector envs over it declare
            self.observation_space = env.observation_space
        self._to_text = obs_to_text or globals()["obs_to_text"]
        self._text = ""

    def action_lookup_for_episode(self) -> dict[int, str] | None:
        space = self.env.action_space
        if isinstance(space, spaces.Discrete):
            start = int(space.start)
            return {i: str(i) for i in range(start, start + int(space.n))}
        return None

    def parse_action(self, action: Any) -> Any:
        if isinstance(self.env.action_space, spaces.Discrete):
            return super().parse_action(action)
        try:
            return action if self.env.action_space.contains(action) else None
        except (TypeError, ValueError):
            return None

    def _reset(self, seed: int, options: dict[str, Any]) -> str:
        obs, _info = self.env.reset(seed=seed, options=options or None)
        self._text = self._to_text(obs)
        return self._text

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if action is None:
            return self._text, 0.0, False, False, {"action_is_valid": False}
        obs, reward, terminated, truncated, inner = self.env.step(action)
        before, self._text = self._text, self._to_text(obs)
        info = {str(k): _plain(v) for k, v in inner.items()}
        info.update(action_is_valid=True, action_is_effective=self._text != before,
                    success=bool(terminated) and float(reward) > 0)
        return self._text, float(reward), bool(terminated), bool(truncated), info

    def _render_text(self) -> str:
        return self._text

    def close(self) -> None:
        self.env.close()


def from_factory(factory: Callable[..., Any], **kwargs: Any) -> TextEnv:
    """``factory(**kwargs)`` as a turnpool env: a `TextEnv` as it is, a gymnasium env wrapped
    in `GymTextEnv`. The pool ships ``factory`` to its workers, so it must be picklable (a
    module-level function or class; cloudpickle also takes closures on most backends)."""
    env = factory(**kwargs)
    if isinstance(env, TextEnv):
        return env
    if isinstance(env, gymnasium.Env):
        return GymTextEnv(env=env)
    raise TypeError(f"env factory {factory!r} returned {type(env).__name__}, "
                    "not a turnpool TextEnv or a gymnasium.Env")
