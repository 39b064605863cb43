"""process_pool backend with real processes: its executor-style options, exact results,
faults isolated, nothing left behind.

(Its equivalence over every env type x worker count x start method is in
``tests/pool/test_pool_equivalence.py``.)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.faults import (
    GONE_S,
    UNPICKLABLE_ENV,
    check_fault_isolated,
    check_mates_not_held,
    faulty_pool,
    kill_parent_and_check,
    wait_gone,
)
from tests.traces import short_trace
from turnpool.backends.process_pool import ProcessPoolBackend
from turnpool.envs.synthetic import TrivialEnv
from turnpool.pool import EnvGroupSpec, EnvPool
from turnpool.worker.build import EnvBuild

pytestmark = pytest.mark.timeout(120)


class PidEnv(TrivialEnv):
    """Told ``"where"``, reports the process it runs in, so a test can see where it lives."""

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = super()._step(action)
        if action == "where":
            info = {**info, "pid": os.getpid()}
        return obs, reward, terminated, truncated, info


def test_process_pool_default_and_max_workers() -> None:
    builds = [EnvBuild(i, "turnpool.envs.synthetic:TrivialEnv") for i in range(100)]
    assert ProcessPoolBackend(builds).num_workers == min(8, os.cpu_count() or 1)
    assert ProcessPoolBackend(builds[:1]).num_workers == 1
    assert ProcessPoolBackend(builds, max_workers=3).num_workers == 3
    assert ProcessPoolBackend(builds, 5, max_workers=3).num_workers == 5  # explicit wins
    with EnvPool("trivial", env_num=4, backend="process_pool", max_workers=1,
                 mp_context="fork") as pool:
        assert pool.backend_name == "process_pool" and pool.num_workers == 1


def test_process_pool_sequential_env_types_stay_in_the_caller() -> None:
    pid_env = f"{__name__}:PidEnv"
    specs = [EnvGroupSpec("web", "trivial", 2), EnvGroupSpec("cpu", pid_env, 2)]
    kwargs: dict[str, Any] = {"group_n": 2, "seed": 5, "num_workers": 2}
    with EnvPool.from_specs(specs, backend="sequential", **kwargs) as reference:
        want = short_trace(reference)
    with EnvPool.from_specs(specs, backend="process_pool", mp_context="fork",
                            sequential_env_types=["trivial"], **kwargs) as pool:
        assert pool.backend_name == "process_pool"
        assert len(pool.worker_pids()) == 2  # the trivial envs got no process
        assert short_trace(pool) == want
        _, _, _, infos = pool.step(["where"] * pool.num_envs)
    caller = os.getpid()
    assert all(i["pid"] != caller for i, tag in zip(infos, pool.tags) if tag == "cpu")
    assert len({i["pid"] for i, tag in zip(infos, pool.tags) if tag == "cpu"}) == 2


@pytest.fixture(scope="module")
def process_pool_faulty() -> Any:
    # without hand-off, so that a hang takes the kill-and-replay path
    pool = faulty_pool("process_pool", mp_context="forkserver", handoff_after=None)
    assert pool.backend_name == "process_pool"
    yield pool
    pids = pool.worker_pids()
    pool.close()
    assert wait_gone(pids, 0.0) == []  # close() returns after its workers are gone


@pytest.mark.parametrize("fault", ["raise", "exit", "hang"])
def test_process_pool_fault_is_isolated(process_pool_faulty: EnvPool, fault: str) -> None:
    pids, now = check_fault_isolated(process_pool_faulty, fault)
    assert now[1] == pids[1]  # the other worker was untouched
    if fault != "raise":
        assert now[0] != pids[0] and wait_gone([pids[0]], GONE_S) == []


def test_process_pool_a_hung_env_holds_back_only_itself() -> None:
    check_mates_not_held("process_pool")


def test_process_pool_workers_die_with_a_killed_parent(tmp_path: Path) -> None:
    kill_parent_and_check(tmp_path, {"backend": "process_pool", "mp_context": "forkserver"})


def test_process_pool_unpicklable_results_fail_only_their_envs() -> None:
    with EnvPool(UNPICKLABLE_ENV, env_num=2, group_n=2, seed=1, backend="process_pool",
                 num_workers=2) as pool:
        assert pool.backend_name == "process_pool"
        pool.reset()
        _, _, dones, infos = pool.step(["a", "lambda", "b", "c"])
        assert dones == [False, True, False, False]
        assert "unpicklable result" in infos[1]["error"]
        assert [i["t"] for k, i in enumerate(infos) if k != 1] == [1, 1, 1]
