"""turnpool's envs under gymnasium ids: ``gymnasium.make("turnpool/Sokoban-v0")``.

``import turnpool`` registers ``turnpool/<Name>-v0`` for every built-in env (`GYM_NAMES`);
without it, ``gymnasium.make("turnpool:turnpool/Sokoban-v0")`` imports turnpool first, as
gymnasium does for ``"module:id"``. Each id has a ``vector_entry_point``, so
``gymnasium.make_vec(id, num_envs=N)`` (``vectorization_mode="vector_entry_point"``, the default
for these ids) returns a `turnpool.pool.vector.PoolVectorEnv` over an `EnvPool`
(``backend=``, ``num_workers=``, ``autoreset_mode=``, ``seed=`` and ``step_timeout=`` as keyword
arguments; gymnasium refuses ``vector_kwargs`` for a custom vector env), while
``vectorization_mode="sync"``/``"async"`` give gymnasium's own vector envs over the same envs.

Example:
    >>> import gymnasium, turnpool
    >>> env = gymnasium.make("turnpool/FrozenLake-v0")
    >>> obs, info = env.reset(seed=3)
    >>> env.unwrapped.spec.id, info["success"]
    ('turnpool/FrozenLake-v0', False)
"""

from __future__ import annotations

from typing import Any

import gymnasium

from turnpool.envs.base import TextEnv

#: the gymnasium name of each built-in env (``turnpool/<name>-v0``)
GYM_NAMES: dict[str, str] = {
    "sokoban": "Sokoban", "frozen_lake": "FrozenLake", "bandit": "Bandit",
    "countdown": "Countdown", "deepcoder": "DeepCoder", "metamathqa": "MetaMathQA",
    "webshop": "WebShop", "webshop_lite": "WebShopLite", "sudoku": "Sudoku",
    "game_2048": "Game2048", "rubikscube": "RubiksCube", "search": "SearchQA",
}
VECTOR_ENTRY_POINT = "turnpool.pool.vector:PoolVectorEnv"


def gym_id(name: str) -> str:
    """The gymnasium id of a built-in env name (``"sokoban"`` -> ``"turnpool/Sokoban-v0"``)."""
    return f"turnpool/{GYM_NAMES[name]}-v0"


def build(turnpool_name: str, **kwargs: Any) -> TextEnv:
    """What gymnasium calls for a ``turnpool/...`` id: `turnpool.make` with the id's name."""
    from turnpool.envs.registry import make

    return make(turnpool_name, **kwargs)


class EnvCreator:
    """What gymnasium loads for ``turnpool/<Name>-v0`` (``turnpool.envs.gym_ids:<Name>``):
    it builds the env with `build` and shows gymnasium the env class's ``metadata``, so
    ``gymnasium.make`` applies its render wrappers (``render_mode="rgb_array_list"``, ...)."""

    def __init__(self, turnpool_name: str) -> None:
        self.turnpool_name = turnpool_name

    @property
    def metadata(self) -> dict[str, Any]:
        from turnpool.envs.registry import resolve

        return dict(resolve(self.turnpool_name)[0].metadata)

    def __call__(self, turnpool_name: str | None = None, **kwargs: Any) -> TextEnv:
        return build(turnpool_name or self.turnpool_name, **kwargs)


def __getattr__(attr: str) -> EnvCreator:
    """``turnpool.envs.gym_ids.<Name>``: the `EnvCreator` of a built-in env's gymnasium name."""
    for name, gym_name in GYM_NAMES.items():
        if gym_name == attr:
            return EnvCreator(name)
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


def register_gym_ids() -> None:
    """Register every built-in env's id with gymnasium (idempotent)."""
    for name in GYM_NAMES:
        env_id = gym_id(name)
        if env_id not in gymnasium.registry:
            gymnasium.register(env_id, entry_point=f"{__name__}:{GYM_NAMES[name]}",
                               vector_entry_point=VECTOR_ENTRY_POINT,
                               kwargs={"turnpool_name": name}, disable_env_checker=False)
