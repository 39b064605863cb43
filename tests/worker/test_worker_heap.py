"""A worker process moves its heap at start out of the collector's walks (`gc.freeze`); the
pool's own process is never touched, whichever backend serves there."""

from __future__ import annotations

import gc
from typing import Any

from turnpool.envs.synthetic import TrivialEnv
from turnpool.pool import EnvPool


class FreezeProbe(TrivialEnv):
    """Reports, in each step's info, how many objects its process has frozen."""

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = super()._step(action)
        info["frozen"] = gc.get_freeze_count()
        return obs, reward, terminated, truncated, info


ENTRY = f"{__name__}:FreezeProbe"


def test_a_worker_process_freezes_its_heap_once_its_envs_are_built() -> None:
    with EnvPool(ENTRY, env_num=2, group_n=1, seed=1, backend="process",
                 num_workers=2) as pool:
        pool.reset()
        _, _, _, infos = pool.step(["a", "b"])
    assert all(info["frozen"] > 0 for info in infos)


def test_the_pools_own_process_is_not_frozen() -> None:
    before = gc.get_freeze_count()
    for backend in ("sequential", "thread"):
        with EnvPool(ENTRY, env_num=2, group_n=1, seed=1, backend=backend) as pool:
            pool.reset()
            _, _, _, infos = pool.step(["a", "b"])
        assert [info["frozen"] for info in infos] == [before, before]
    assert gc.get_freeze_count() == before
