"""Envs of other libraries, by name: ``"gem:game:Sokoban-v0-easy"``, ``"rg:leg_counting"``,
``"textarena:Wordle-v0"``, ``"skyrl:gsm8k"``, ``"verifiers:add-easy"``.

A *hub* is a library that offers many envs under its own ids. `HUBS` is the one table of them:
the name's prefix (before the first ``:``), the library's import name, the pip extra that
installs it, and the turnpool adapter class (one module per library beside this one, each a
`turnpool.envs.hubs.base.HubEnv`). Every layer reads this table and nothing else names a hub:
`turnpool.envs.registry` turns ``"<prefix>:<id>"`` into the adapter's entry point with
``env_id=<id>`` (so `make`, `EnvPool`, configs' ``env_type`` and ``turnpool serve --env`` take
these names, and workers rebuild them on every backend), and ``turnpool envs --hub <prefix>``
lists what the library offers (`turnpool.envs.hubs.base.listing`).

A hub prefix wins over an entry point of the same spelling: ``"gem:Env"`` names GEM's env id
``Env``, not the attribute ``Env`` of a module ``gem``.

This module imports no library: it is read on every ``make``.

    >>> split("gem:game:Sokoban-v0-easy")
    (Hub(prefix='gem', ...), 'game:Sokoban-v0-easy')
    >>> split("rg:leg_counting")[0].extra, split("sokoban")
    ('reasoning-gym', None)
    >>> hub("reasoning-gym").prefix
    'rg'
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from turnpool.extras import require


class GlobalRngScope:
    """An env's own copy of the process-global ``random`` and ``numpy.random`` states.

    ``with scope:`` swaps the env's states in and, on the way out, keeps what the library left
    and puts the caller's back, so a library that seeds or draws from them (GEM seeds both on
    reset; reasoning-gym draws on import) neither sees nor moves anyone else's draws. `seed`
    starts the env's states from a seed without touching the process's (the states that
    ``random.seed(seed)`` / ``np.random.seed(seed)`` would give). Not reentrant.

        >>> scope = GlobalRngScope(seed=7)
        >>> with scope:
        ...     inside = random.random()
        >>> inside == random.Random(7).random()
        True
    """

    def __init__(self, seed: int = 0) -> None:
        self._outer: tuple[Any, Any] | None = None
        self.seed(seed)

    def seed(self, seed: int) -> None:
        self._py = random.Random(seed).getstate()
        self._np = np.random.RandomState(seed % 2**32).get_state()

    def __enter__(self) -> GlobalRngScope:
        self._outer = random.getstate(), np.random.get_state()
        random.setstate(self._py)
        np.random.set_state(self._np)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._outer is not None
        self._py, self._np = random.getstate(), np.random.get_state()
        random.setstate(self._outer[0])
        np.random.set_state(self._outer[1])
        self._outer = None


@dataclass(frozen=True)
class Hub:
    """One library of envs: how its names look, what installs it, what adapts it."""

    #: the names' prefix: ``"<prefix>:<the library's own id>"``
    prefix: str
    #: the library's import name (what `require` imports)
    library: str
    #: the pip extra that installs it: ``pip install 'turnpool[<extra>]'``
    extra: str
    #: the library's name as its authors write it (docs, messages)
    title: str
    #: the adapter class, ``"module.path:Class"``
    entry_point: str
    #: other spellings accepted by `hub` (``turnpool envs --hub reasoning-gym``)
    aliases: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"Hub(prefix={self.prefix!r}, ...)"

    def require(self) -> ModuleType:
        """The library's module, or `turnpool.extras.MissingExtra` naming the extra; imported
        in a scope of its own (reasoning-gym draws from ``random`` on import)."""
        with GlobalRngScope():
            return require(self.library, feature=f"{self.title} envs ({self.prefix}:...)",
                           extra=self.extra)


_MOD = "turnpool.envs.hubs"

#: Every hub turnpool adapts (prefix, library, extra, title, adapter).
HUBS: tuple[Hub, ...] = (
    Hub("gem", "gem", "gem", "GEM", f"{_MOD}.gem:GemEnv"),
    Hub("rg", "reasoning_gym", "reasoning-gym", "reasoning-gym", f"{_MOD}.rg:ReasoningGymEnv",
        aliases=("reasoning-gym", "reasoning_gym")),
    Hub("textarena", "textarena", "textarena", "TextArena", f"{_MOD}.textarena:TextArenaEnv",
        aliases=("ta",)),
    Hub("skyrl", "skyrl_gym", "skyrl-gym", "SkyRL-gym", f"{_MOD}.skyrl:SkyRLEnv",
        aliases=("skyrl-gym", "skyrl_gym")),
    Hub("verifiers", "verifiers.v1", "verifiers", "verifiers", f"{_MOD}.verifiers:VerifiersEnv",
        aliases=("vf",)),
)

_BY_PREFIX = {h.prefix: h for h in HUBS}


def hub(name: str) -> Hub:
    """The hub named by its prefix or an alias; `KeyError` listing the prefixes otherwise."""
    wanted = name.strip().lower()
    for h in HUBS:
        if wanted == h.prefix or wanted in h.aliases:
            return h
    raise KeyError(f"unknown env library {name!r}; known: {', '.join(_BY_PREFIX)}")


def split(name: str) -> tuple[Hub, str] | None:
    """``(hub, the library's id)`` for ``"<prefix>:<id>"``, else None (not a hub name)."""
    prefix, sep, env_id = name.partition(":")
    found = _BY_PREFIX.get(prefix)
    if not sep or found is None:
        return None
    return found, env_id


__all__ = ["HUBS", "GlobalRngScope", "Hub", "hub", "split"]
