"""joblib backend with real workers in every flavour: its ``n_jobs`` option, exact results,
faults isolated, nothing left behind."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.faults import (
    check_fault_isolated,
    check_mates_not_held,
    faulty_pool,
    kill_parent_and_check,
    wait_gone,
)
from tests.traces import short_trace
from turnpool.backends.joblib import JoblibBackend
from turnpool.envs.synthetic import TrivialEnv
from turnpool.pool import EnvPool
from turnpool.worker.build import EnvBuild
from turnpool.worker.errors import BackendUnavailable

pytestmark = pytest.mark.timeout(120)


def test_joblib_n_jobs() -> None:
    builds = [EnvBuild(i, "turnpool.envs.synthetic:TrivialEnv") for i in range(64)]
    import joblib

    assert JoblibBackend(builds, n_jobs=-1).num_workers == joblib.cpu_count()
    assert JoblibBackend(builds, n_jobs=3).num_workers == 3
    assert JoblibBackend(builds[:2], n_jobs=8).num_workers == 2
    with pytest.raises(ValueError, match="joblib_backend"):
        JoblibBackend(builds, joblib_backend="dask")


def test_joblib_start_failure_leaves_nothing_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """The progress files this backend made are gone (only its own: other turnpool runs on the
    machine may have theirs in /dev/shm at the same time)."""
    import turnpool.backends.joblib as joblib_module
    from turnpool.worker.errors import BackendUnavailable
    from turnpool.worker.transport import ProgressSlot

    made: list[str] = []

    class RecordingSlot(ProgressSlot):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self.path)

    monkeypatch.setattr(joblib_module, "ProgressSlot", RecordingSlot)
    builds = [EnvBuild(i, "turnpool.envs.synthetic:TrivialEnv") for i in range(4)]
    backend = JoblibBackend(builds, 2, joblib_backend="threading")
    with pytest.raises(BackendUnavailable, match="did not"):
        backend.start(timeout=0.0)  # no worker can connect in no time
    assert made and not [p for p in made if os.path.exists(p)]


@pytest.mark.parametrize("flavour", ["multiprocessing", "threading"])
def test_joblib_flavours_match_sequential(flavour: str) -> None:
    with EnvPool("frozen_lake", env_num=3, group_n=2, seed=9, backend="sequential") as ref:
        want = short_trace(ref)
    with EnvPool("frozen_lake", env_num=3, group_n=2, seed=9, backend="joblib",
                 joblib_backend=flavour, num_workers=3) as pool:
        assert pool.backend_name == "joblib" and pool.num_workers == 3
        assert short_trace(pool) == want


@pytest.mark.parametrize(("flavour", "fault"), [("loky", "hang"), ("loky", "raise"),
                                                ("multiprocessing", "exit"),
                                                ("threading", "hang")])
def test_joblib_fault_is_isolated(flavour: str, fault: str) -> None:
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    # without hand-off, so that a hang takes the interrupt (or abandon) path
    with faulty_pool("joblib", joblib_backend=flavour, handoff_after=None) as pool:
        assert pool.backend_name == "joblib"
        pids, _ = check_fault_isolated(pool, fault)
        if flavour != "threading":
            # A hung loky task is interrupted, not killed: loky would take every worker down.
            assert pool.worker_pids()[1] == pids[1]
        pids += pool.worker_pids()
    assert wait_gone(pids, 0.0) == []
    if flavour != "threading":
        after = {c.pid for c in psutil.Process().children(recursive=True)}
        helpers = {c.pid for c in psutil.Process().children(recursive=True)
                   if "resource_tracker" in " ".join(c.cmdline())}
        # loky's idle workers were shut down too; multiprocessing's pools, including the one
        # whose call a dead worker left waiting, were terminated and joined before close
        # returned (the process its pool started in the dead one's place too)
        assert after - before - helpers == set()


@pytest.mark.parametrize("flavour", ["loky", "threading"])
def test_joblib_a_hung_env_holds_back_only_itself(flavour: str) -> None:
    check_mates_not_held("joblib", joblib_backend=flavour)


def test_joblib_workers_die_with_a_killed_parent(tmp_path: Path) -> None:
    kill_parent_and_check(tmp_path, {"backend": "joblib", "joblib_backend": "loky"})


class GlobalRngEnv(TrivialEnv):
    """Says it draws from the process-global RNG (as a wrapped library env may)."""

    uses_global_rng = True


def test_joblib_threads_refuse_envs_that_draw_from_the_global_rng() -> None:
    """The refusal the thread backend has holds for joblib's threading flavour too: made once,
    at the choice, before any worker starts."""
    env = f"{__name__}:GlobalRngEnv"
    with pytest.raises(BackendUnavailable, match="GlobalRngEnv draw from the process-global"):
        EnvPool(env, env_num=2, backend="joblib", joblib_backend="threading", num_workers=2)
    with EnvPool(env, env_num=2, backend="joblib", joblib_backend="threading",
                 num_workers=1) as pool:  # one thread: nothing interleaves
        assert len(pool.reset()[0]) == 2
