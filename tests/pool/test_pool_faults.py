"""Fault isolation on the process backend, with real processes that raise, hang and exit."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.faults import (
    GONE_S,
    RESTART_S,
    UNPICKLABLE_ENV,
    kill_parent_and_check,
    mp_helpers,
    wait_gone,
)
from turnpool.pool import EnvPool

pytestmark = pytest.mark.timeout(90)

STEP_TIMEOUT = 2.0
N_GROUPS, GROUP_N = 3, 2  # 6 envs on 2 workers: envs 0-2 and 3-5
FAULTY = 1  # shares worker 0 with innocent envs 0 and 2


@pytest.fixture(scope="module")
def pool() -> Iterator[EnvPool]:
    p = EnvPool("faulty", env_num=N_GROUPS, group_n=GROUP_N, seed=7, backend="process",
                num_workers=2, mp_context="spawn", step_timeout=STEP_TIMEOUT)
    assert p.backend_name == "process"
    yield p
    p.close()


@pytest.fixture(scope="module")
def reference() -> Iterator[EnvPool]:
    p = EnvPool("faulty", env_num=N_GROUPS, group_n=GROUP_N, seed=7, backend="sequential")
    yield p
    p.close()


@pytest.mark.parametrize("fault", ["raise", "exit", "hang", "hang_gil"])
def test_only_the_faulty_env_is_flagged(pool: EnvPool, reference: EnvPool, fault: str) -> None:
    n = pool.num_envs
    assert pool.reset(seed=30) == reference.reset(seed=30)
    warmup = [f"w{i}" for i in range(n)]
    assert pool.step(warmup) == reference.step(warmup)  # history the restart must replay
    turns = [["u", "vv", "w"][: 1 + i % 3] for i in range(n)]
    assert pool.step_turns(turns) == reference.step_turns(turns)
    pids_before = pool.worker_pids()

    actions = ["go"] * n
    actions[FAULTY] = fault
    started = time.monotonic()
    obs, rewards, dones, infos = pool.step(actions)
    elapsed = time.monotonic() - started
    # bounded: the deadline plus a worker restart, with room for a loaded machine; a hang
    # would never return (how fast is `turnpool bench`'s to say)
    assert elapsed < STEP_TIMEOUT + RESTART_S

    ref = reference.step(["go"] * n)
    expected_error = {"raise": "RuntimeError", "exit": "worker died",
                      "hang": "step timeout", "hang_gil": "step timeout"}[fault]
    assert expected_error in infos[FAULTY]["error"]
    assert dones[FAULTY] and rewards[FAULTY] == 0.0 and obs[FAULTY] == ""
    for i in range(n):
        if i != FAULTY:  # innocent envs, including the faulty env's worker-mates
            assert (obs[i], rewards[i], dones[i], infos[i]) == (
                ref[0][i], ref[1][i], ref[2][i], ref[3][i])
            assert "error" not in infos[i]
    if fault in ("raise", "hang"):
        # An env stuck in a call that releases the GIL is given up by its worker (its thread
        # abandoned, the worker kept); a hang holding the GIL needs the worker killed.
        assert pool.worker_pids()[0] == pids_before[0]
    else:
        assert pool.worker_pids()[0] != pids_before[0]
        assert wait_gone([pids_before[0]], GONE_S) == []
    assert pool.worker_pids()[1] == pids_before[1]  # the other worker was untouched

    # The restored envs keep going exactly as if nothing happened ...
    others = [i for i in range(n) if i != FAULTY]
    nxt = pool.step(["again"] * (n - 1), env_ids=others)
    assert nxt == reference.step(["again"] * (n - 1), env_ids=others)
    # ... and the next reset brings the faulty env back.
    obs, infos = pool.reset(seed=31)
    assert (obs, infos) == reference.reset(seed=31)
    assert pool.step(["fine"] * n) == reference.step(["fine"] * n)


def test_stale_replies_are_discarded_after_a_timeout(pool: EnvPool) -> None:
    """A worker that answers after being given up on must not leak into later steps."""
    pool.reset(seed=40)
    actions = ["go"] * pool.num_envs
    actions[4] = "hang"
    _, _, _, infos = pool.step(actions)
    assert "step timeout" in infos[4]["error"]
    _, _, _, infos = pool.step(["go"] * pool.num_envs)
    assert [i["t"] for k, i in enumerate(infos) if k != 4] == [2] * (pool.num_envs - 1)


def test_async_faults_are_isolated(pool: EnvPool, reference: EnvPool) -> None:
    pool.reset(seed=50)
    reference.reset(seed=50)
    pool.step_async([0, 1, 3], [["a"], ["exit"], ["b", "c"]])
    got = {}
    while len(got) < 3:
        got.update(pool.poll(timeout=STEP_TIMEOUT + 5, min_ready=1))
    assert "worker died" in got[1].info["error"]
    want = reference.step_turns([["a"], ["b", "c"]], env_ids=[0, 3])
    assert [got[0], got[3]] == want


def test_close_leaves_no_child_process() -> None:
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    p = EnvPool("trivial", env_num=2, group_n=2, backend="process", num_workers=2,
                mp_context="spawn")
    pids = p.worker_pids()
    assert len(pids) >= 2 and all(psutil.pid_exists(x) for x in pids)
    p.reset()
    p.close()
    assert wait_gone(pids, 0.0) == []  # close() returns only after reaping its workers
    now = {c.pid for c in psutil.Process().children(recursive=True)}
    assert now - before - mp_helpers() == set()


@pytest.mark.parametrize("mp_context", ["spawn", "forkserver", "fork"])
def test_workers_die_with_a_killed_parent(tmp_path: Path, mp_context: str) -> None:
    kill_parent_and_check(tmp_path, {"backend": "process", "mp_context": mp_context},
                          exact_workers=False)  # spawn and forkserver keep a standby


def test_unpicklable_results_and_actions_fail_only_their_envs() -> None:
    with EnvPool(UNPICKLABLE_ENV, env_num=2, group_n=2, seed=1,
                 backend="process", num_workers=2, mp_context="fork") as pool:
        assert pool.backend_name == "process"
        pool.reset()
        _, _, dones, infos = pool.step(["a", "lambda", "b", "c"])
        assert dones == [False, True, False, False]
        assert "unpicklable result" in infos[1]["error"]
        assert [i["t"] for k, i in enumerate(infos) if k != 1] == [1, 1, 1]
        # An action that cannot be pickled fails the envs of that request, not the pool.
        _, _, dones, infos = pool.step([lambda: None, "x"], env_ids=[0, 2])
        assert "could not be sent" in infos[0]["error"] and "error" not in infos[1]
        assert infos[1]["t"] == 2
        obs, infos = pool.reset()
        assert all("error" not in i for i in infos)


def test_no_progress_file_outlives_a_worker_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every progress file the process backend makes is unlinked once its worker has mapped
    it, and an idle standby holds none: a pool owner killed at any moment after start leaves
    nothing in /dev/shm (only this pool's files are checked; other runs may have theirs)."""
    import os
    import signal

    import turnpool.backends.process as process_module
    from turnpool.worker.transport import ProgressSlot

    made: list[str] = []

    class RecordingSlot(ProgressSlot):
        def __init__(self, file: bool = True) -> None:
            super().__init__(file)
            if self.path:
                made.append(self.path)

    monkeypatch.setattr(process_module, "ProgressSlot", RecordingSlot)
    with EnvPool("faulty", env_num=4, group_n=1, seed=1, backend="process", num_workers=2,
                 standby=True) as pool:
        pool.reset(seed=1)
        assert len(made) == 2 and not [p for p in made if os.path.exists(p)]
        os.kill(pool.worker_pids()[0], signal.SIGKILL)  # the standby takes its slice
        pool.step(["a"] * 4)
        assert len(made) == 3 and not [p for p in made if os.path.exists(p)]
