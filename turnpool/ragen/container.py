"""RAGEN's ``MultiProcessEnvironmentContainer`` (seed 000) as a thin wrapper over
`turnpool.pool.EnvPool`, the one implementation of running envs in parallel.

Example:
    >>> from turnpool.ragen.container import MultiProcessEnvironmentContainer
    >>> container = MultiProcessEnvironmentContainer("bandit", env_num=2, group_n=2, seed=42,
    ...                                              backend="sequential")
    >>> obs_list, info_list = container.reset()
    >>> len(obs_list)
    4
    >>> container.close()
"""

from __future__ import annotations

from typing import Any

from turnpool.pool import EnvPool


class MultiProcessEnvironmentContainer:
    """Seed 000's container: ``env_num`` groups of ``group_n`` envs in worker processes
    (EnvPool's defaults: the ``process`` backend, spawn), with
    ``reset() -> (obs_list, info_list)`` and
    ``step(actions) -> (obs_list, rewards, dones, infos)``."""

    def __init__(self, env_type: str, env_num: int, group_n: int, seed: int = 0,
                 env_kwargs: dict[str, Any] | None = None, **pool_options: Any) -> None:
        self.env_type = env_type
        self.env_num = env_num
        self.group_n = group_n
        self.seed = seed
        self.env_kwargs = dict(env_kwargs or {})
        pool_options.setdefault("backend", "process")  # the seed's name promises processes
        self.pool = EnvPool(env_type, env_num=env_num, group_n=group_n, seed=seed,
                            env_kwargs=self.env_kwargs, **pool_options)

    @property
    def num_envs(self) -> int:
        return self.pool.num_envs

    def reset(self, seed: int | None = None) -> tuple[list[str], list[dict[str, Any]]]:
        return self.pool.reset(seed=seed)

    def step(self, actions: list[Any]
             ) -> tuple[list[str], list[float], list[bool], list[dict[str, Any]]]:
        return self.pool.step(actions)

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> MultiProcessEnvironmentContainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
