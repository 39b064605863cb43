"""``lazy_build``: a pool sized for many slots builds each env at its first reset (the first
env of each type at start, so a broken env type still fails the constructor), and its
episodes are those of an eagerly built pool."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from turnpool.envs.synthetic import TrivialEnv
from turnpool.pool import EnvConstructionError, EnvPool

ENTRY = f"{__name__}:CountedEnv"


class CountedEnv(TrivialEnv):
    built: ClassVar[int] = 0

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        type(self).built += 1


class BrokenEnv(TrivialEnv):
    def __init__(self, **kwargs: Any) -> None:
        raise ValueError("cannot be built")


def test_envs_are_built_at_their_first_reset() -> None:
    CountedEnv.built = 0
    with EnvPool(ENTRY, env_num=64, group_n=1, seed=5, backend="sequential",
                 lazy_build=True) as pool, \
            EnvPool(ENTRY, env_num=64, group_n=1, seed=5, backend="sequential") as eager:
        assert CountedEnv.built == 1 + 64  # the lazy pool's first env, the eager pool's all
        _, _, _, infos = pool.step(["a"], env_ids=[7])
        assert infos[0]["failure"] == "env_error" and "reset it first" in infos[0]["error"]
        assert pool.reset(seed=9, env_ids=[7, 8]) == eager.reset(seed=9, env_ids=[7, 8])
        assert CountedEnv.built == 1 + 64 + 2
        assert pool.step(["ab", "c"], env_ids=[7, 8]) == eager.step(["ab", "c"],
                                                                    env_ids=[7, 8])


@pytest.mark.parametrize("backend", ["sequential", "process"])
def test_a_broken_env_type_still_fails_the_constructor(backend: str) -> None:
    with pytest.raises(EnvConstructionError, match="cannot be built"):
        EnvPool(f"{__name__}:BrokenEnv", env_num=8, backend=backend, lazy_build=True)
