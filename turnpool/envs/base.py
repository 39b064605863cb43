"""The text-environment contract every turnpool env follows.

A `TextEnv` mirrors gymnasium's API (``reset(seed=...) -> (obs, info)``, ``step(a) -> (obs,
reward, terminated, truncated, info)``) with text observations. What it adds for multi-turn
LLM RL:

* every env owns a ``numpy.random.Generator`` (``self.np_random``) created from the reset seed,
  so the same seed gives byte-identical episodes in any process, thread or start method;
* ``info`` always carries ``success``, ``action_is_valid``, ``action_is_effective`` and
  ``anchor_obs`` (a state text without counters, for GiGPO step grouping);
* ``get_state`` / ``set_state`` let the pool build a group's initial state once and copy it to
  the other members (the expensive part of Sokoban is room generation).

Example:
    >>> import turnpool
    >>> env = turnpool.make("bandit")
    >>> obs, info = env.reset(seed=3)
    >>> sorted(info)[:3]
    ['action_is_effective', 'action_is_valid', 'anchor_obs']
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

#: ``oracle(obs, env_config) -> action names`` that solve (or answer) the current state.
OracleFn = Callable[..., list[str]]

#: What an env's actions look like to the projection (LLM text -> action):
#: ``discrete`` (a fixed ``action_lookup``: names -> ids), ``names`` (names whose ids change
#: per episode), ``word``, ``expression`` (arithmetic, never evaluated by the projection),
#: ``free_text`` and ``webshop`` (``search[...]`` / ``click[...]``).
ACTION_KINDS = ("discrete", "names", "word", "expression", "free_text", "webshop")

INFO_KEYS = ("success", "action_is_valid", "action_is_effective", "anchor_obs")


class TextEnv:
    """Base class: a text environment with a per-env RNG and RAGEN-compatible info keys.

    Subclasses implement ``_reset(seed) -> obs`` and ``_step(action) -> (obs, reward,
    terminated, truncated, info)``; the base class seeds ``np_random``, fills the standard info
    keys and maps action names to ids for discrete envs.
    """

    #: id -> name for discrete envs (None for free-text envs such as countdown).
    action_lookup: ClassVar[dict[int, str] | None] = None
    #: One of ``ACTION_KINDS``; ``None`` derives it: ``discrete`` with an ``action_lookup``,
    #: ``names`` when that lookup changes per episode, else ``free_text``.
    action_kind: ClassVar[str | None] = None
    #: The env's own solver (used by the oracle policy), or ``None``; set it with
    #: ``MyEnv.oracle = staticmethod(fn)``.
    oracle: ClassVar[staticmethod[..., list[str]] | OracleFn | None] = None
    #: symbol -> meaning, for the prompt legend (None for envs without a grid).
    grid_vocab: ClassVar[dict[str, str] | None] = None
    #: Free text shown to the model before the first observation.
    instruction: ClassVar[str] = ""
    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["text"]}

    def __init__(self, **config: Any) -> None:
        self.config: dict[str, Any] = dict(config)
        self.np_random: np.random.Generator = np.random.default_rng(0)
        self.seed: int | None = None

    # ----------------------------------------------------------------- public API
    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode. ``seed=None`` draws a fresh seed from OS entropy."""
        if seed is None:
            seed = int(np.random.SeedSequence().entropy % (2**63))  # type: ignore[operator]
        self.seed = int(seed)
        self.np_random = np.random.default_rng(self.seed)
        obs = self._reset(self.seed, options or {})
        return obs, self._info({"success": False, "action_is_valid": True,
                                "action_is_effective": False})

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply one action. Unknown actions are not errors: ``action_is_valid=False``."""
        obs, reward, terminated, truncated, info = self._step(self.parse_action(action))
        return obs, float(reward), bool(terminated), bool(truncated), self._info(info)

    def render(self, mode: str | None = None) -> Any:
        """The current observation text (``mode="text"``); envs may offer ``rgb_array``."""
        return self._render_text()

    def close(self) -> None:
        """Release resources. Idempotent."""

    def parse_action(self, action: Any) -> Any:
        """Map an action name (any case) to its id for discrete envs; pass others through.

        Returns ``None`` when a discrete env receives something that is not one of its actions.
        """
        lookup = self.action_lookup_for_episode()
        if lookup is None:
            return action
        if isinstance(action, (int, np.integer)) and not isinstance(action, bool):
            return int(action) if int(action) in lookup else None
        if isinstance(action, str):
            wanted = action.strip().lower()
            for aid, name in lookup.items():
                if name.lower() == wanted:
                    return aid
        return None

    def action_lookup_for_episode(self) -> dict[int, str] | None:
        """The id -> name map in force now (Bandit shuffles its arms per episode)."""
        return self.action_lookup

    def anchor_obs(self) -> str:
        """State text identical for two envs in the same state (no counters, no history)."""
        return self._render_text()

    # ------------------------------------------------------------ group copying
    def get_state(self) -> Any:
        """A picklable snapshot of the full episode state, RNG included."""
        state = {k: copy.deepcopy(v) for k, v in self.__dict__.items() if k != "np_random"}
        state["__rng__"] = self.np_random.bit_generator.state
        return state

    def set_state(self, state: Any) -> None:
        """Restore a snapshot from ``get_state`` (possibly taken in another env instance)."""
        state = dict(state)
        rng_state = state.pop("__rng__")
        self.__dict__.update(copy.deepcopy(state))
        self.np_random = np.random.default_rng()
        self.np_random.bit_generator.state = rng_state

    # ------------------------------------------------------------ subclass hooks
    def _reset(self, seed: int, options: dict[str, Any]) -> str:
        raise NotImplementedError

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        raise NotImplementedError

    def _render_text(self) -> str:
        raise NotImplementedError

    def _info(self, info: dict[str, Any]) -> dict[str, Any]:
        out = dict(info)
        out.setdefault("success", False)
        out.setdefault("action_is_valid", True)
        out.setdefault("action_is_effective", False)
        out["success"] = bool(out["success"])
        out["action_is_valid"] = bool(out["action_is_valid"])
        out["action_is_effective"] = bool(out["action_is_effective"])
        out["anchor_obs"] = self.anchor_obs()
        return out
