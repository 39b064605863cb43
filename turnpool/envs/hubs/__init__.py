"""Envs of other libraries by name: ``"<library>:<its env id>"``.

``turnpool.make("textarena:TicTacToe-v0")`` builds the library's adapter class with the id as
``env_id``; `hub_target` is what the registry asks first, so these names work wherever an
env name does (`turnpool.make`, ``EnvPool``, configs' ``env_type``, ``turnpool serve --env``).
"""

from __future__ import annotations

from typing import Any

#: library prefix -> its adapter class's entry point
HUBS: dict[str, str] = {
    "textarena": "turnpool.envs.hubs.textarena:TextArenaEnv",
}


def hub_target(name: str) -> tuple[str, dict[str, Any]] | None:
    """``(adapter entry point, {"env_id": id})`` for ``"<library>:<id>"``; None otherwise."""
    prefix, sep, env_id = name.partition(":")
    if sep and env_id and prefix in HUBS:
        return HUBS[prefix], {"env_id": env_id}
    return None
