"""Seed-named facades: the classes the seed documents describe, as thin wrappers over the one
implementation of each idea (`turnpool.pool.EnvPool` for running envs in parallel).

Example:
    >>> from turnpool.compat import MultiProcessEnvironmentContainer
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
    (spawn), with ``reset() -> (obs_list, info_list)`` and
    ``step(actions) -> (obs_list, rewards, dones, infos)``."""

    def __init__(self, env_type: str, env_num: int, group_n: int, seed: int = 0,
                 env_kwargs: dict[str, Any] | None = None, **pool_options: Any) -> None:
        pool_options.setdefault("backend", "process")
        pool_options.setdefault("mp_context", "spawn")
        self.env_type = env_type
        self.env_num = env_num
        self.group_n = group_n
        self.seed = seed
        self.env_kwargs = dict(env_kwargs or {})
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


# RAGEN's rollout facades (seeds 001, 002) live next to the collector they wrap.
from turnpool.compat_rollout import EnvStateManager, ParallelRolloutManager  # noqa: E402

__all__ = ["EnvStateManager", "MultiProcessEnvironmentContainer", "ParallelRolloutManager"]
