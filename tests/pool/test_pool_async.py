"""Ready-first stepping (``step_async`` / ``poll``): every submitted turn comes back exactly
once with the result a synchronous pool gives, on every backend, and faults stay isolated."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from turnpool.pool import EnvError, EnvPool, TurnResult
from turnpool.worker.results import ResetResult

pytestmark = pytest.mark.timeout(120)

STEP_TIMEOUT = 2.0


def _drain(pool: EnvPool, got: dict[int, list[TurnResult]]) -> None:
    for _ in range(100):
        if not pool.in_flight:
            return
        for env_id, result in pool.poll(timeout=30.0, min_ready=len(pool.in_flight)):
            got.setdefault(env_id, []).append(result)
    raise AssertionError(f"envs {sorted(pool.in_flight)} never came back")


@pytest.mark.parametrize("backend", ["sequential", "thread", "process", "process_pool",
                                     "joblib"])
def test_every_submitted_turn_comes_back_exactly_once(backend: str) -> None:
    """Random subsets in flight, random poll sizes and timeouts: no env is stepped twice for
    one turn, none is lost, and each env's results equal a synchronous replay."""
    kwargs: dict[str, Any] = {"env_num": 4, "group_n": 3, "seed": 11,
                              "env_kwargs": {"episode_len": 10_000}}
    with EnvPool("trivial", backend=backend, num_workers=2, fallback=False, **kwargs) as pool:
        assert pool.backend_name == backend
        n = pool.num_envs
        pool.reset(seed=3)
        rng = np.random.default_rng(0)
        sent: dict[int, list[list[str]]] = {i: [] for i in range(n)}
        got: dict[int, list[TurnResult]] = {}
        for _ in range(40):
            idle = [i for i in range(n) if i not in pool.in_flight]
            if idle:
                pick = [int(i) for i in rng.choice(idle, size=int(rng.integers(1, len(idle) + 1)),
                                                   replace=False)]
                turns = [[f"a{int(rng.integers(100))}" for _ in range(int(rng.integers(0, 3)))]
                         for _ in pick]
                pool.step_async(pick, turns)
                assert set(pick) <= pool.in_flight
                for i, acts in zip(pick, turns):
                    sent[i].append(acts)
            timeout = float(rng.choice([0.0, 0.001, 5.0]))
            for env_id, result in pool.poll(timeout=timeout, min_ready=int(rng.integers(0, 4))):
                assert env_id not in pool.in_flight
                got.setdefault(env_id, []).append(result)
        _drain(pool, got)
        assert pool.poll(timeout=0.0) == []

    with EnvPool("trivial", backend="sequential", **kwargs) as ref:
        ref.reset(seed=3)
        for i in range(n):
            assert len(got.get(i, [])) == len(sent[i]), f"env {i}"
            want = [ref.step_turns([acts], [i])[0] for acts in sent[i]]
            assert got.get(i, []) == want, f"env {i}"
            steps = 0
            for acts, r in zip(sent[i], got.get(i, [])):
                assert r.n_executed == len(acts) and r.error is None
                steps += len(acts)
                if acts:  # the env's own step counter: each action ran exactly once
                    assert r.info["t"] == steps
        assert sum(len(v) for v in sent.values()) > 40


def _fault_case(backend: str) -> tuple[dict[int, str], dict[int, str]]:
    """env id -> fault action, env id -> expected error text (worker 0: envs 0-3)."""
    if backend == "process":
        return ({1: "hang", 3: "raise", 5: "exit"},
                {1: "step timeout", 3: "RuntimeError", 5: "worker died"})
    return {1: "hang", 5: "raise"}, {1: "step timeout", 5: "RuntimeError"}


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_async_faults_are_isolated_like_sync_faults(backend: str) -> None:
    faults, expected = _fault_case(backend)
    kwargs: dict[str, Any] = {"env_num": 4, "group_n": 2, "seed": 7}
    with EnvPool("faulty", backend=backend, num_workers=2, step_timeout=STEP_TIMEOUT,
                 fallback=False, **kwargs) as pool, \
            EnvPool("faulty", backend="sequential", **kwargs) as ref:
        n = pool.num_envs
        assert pool.reset(seed=5) == ref.reset(seed=5)
        warm = [["w", "ww"][: 1 + i % 2] for i in range(n)]  # history a restart must replay
        assert pool.step_turns(warm) == ref.step_turns(warm)
        # Separate calls, so innocent requests queue behind the faulty ones on each worker.
        calls = [[1], [0, 4], [5], [2, 3, 6, 7]]
        turns = {i: [f"x{i}", "y"][: 1 + i % 2] for i in range(n)}
        for ids in calls:
            pool.step_async(ids, [[faults[i]] if i in faults else turns[i] for i in ids])
        got: dict[int, list[TurnResult]] = {}
        _drain(pool, got)
        assert sorted(got) == list(range(n)) and all(len(v) == 1 for v in got.values())
        innocent = [i for i in range(n) if i not in faults]
        want = ref.step_turns([turns[i] for i in innocent], innocent)
        assert [got[i][0] for i in innocent] == want
        for i, text in expected.items():
            r = got[i][0]
            assert text in r.info["error"] and r.error == r.info["error"]
            assert r.done and r.truncated and r.reward_sum == 0.0 and r.obs == ""
        # Innocent worker-mates were rebuilt exactly: they go on as if nothing happened.
        again = pool.step_turns([["z"]] * len(innocent), innocent)
        assert again == ref.step_turns([["z"]] * len(innocent), innocent)
        # A flagged env stays failed without reaching a worker, until its reset.
        pool.step_async(sorted(faults), [["z"]] * len(faults))
        late: dict[int, list[TurnResult]] = {}
        _drain(pool, late)
        assert all("failed earlier" in late[i][0].info["error"] for i in faults)
        assert pool.reset(seed=6) == ref.reset(seed=6)
        pool.step_async(list(range(n)), [["ok"]] * n)
        final: dict[int, list[TurnResult]] = {}
        _drain(pool, final)
        assert [final[i][0] for i in range(n)] == ref.step_turns([["ok"]] * n)


def test_poll_returns_finished_envs_while_another_worker_is_stuck() -> None:
    with EnvPool("faulty", env_num=2, group_n=2, seed=1, backend="process", num_workers=2,
                 step_timeout=120.0, fallback=False) as pool:
        pool.reset()
        pool.step_async([0], [["hang"]])  # worker 0 never answers
        pool.step_async([2, 3], [["a"], ["b", "c"]])  # worker 1
        got = dict(pool.poll(timeout=60.0, min_ready=1))
        assert sorted(got) == [2, 3] and pool.in_flight == {0}
        assert got[3].n_executed == 2 and got[3].error is None
        assert pool.poll(timeout=0.0) == []
        with pytest.raises(RuntimeError, match="in flight"):
            pool.step_async([0], [["again"]])


def test_on_error_raise_in_async_mode_loses_no_result() -> None:
    """The failed env is reported by `EnvError`; results polled with it are kept for the next
    poll rather than dropped with the exception."""
    kwargs: dict[str, Any] = {"env_num": 2, "group_n": 2, "seed": 3}
    with EnvPool("faulty", backend="sequential", num_workers=1, on_error="raise",
                 **kwargs) as pool, EnvPool("faulty", backend="sequential", **kwargs) as ref:
        pool.reset()
        ref.reset()
        pool.step_async([0, 1, 2, 3], [["a"], ["raise"], ["b"], ["c", "d"]])
        with pytest.raises(EnvError) as err:
            pool.poll(timeout=10.0, min_ready=4)
        assert list(err.value.errors) == [1] and "RuntimeError" in err.value.errors[1]
        got = dict(pool.poll(timeout=10.0, min_ready=3))
        assert sorted(got) == [0, 2, 3] and not pool.in_flight
        want = ref.step_turns([["a"], ["b"], ["c", "d"]], [0, 2, 3])
        assert [got[0], got[2], got[3]] == want


@pytest.mark.parametrize("backend", ["sequential", "process"])
def test_reset_async_gives_what_reset_gives_and_overlaps_turns(backend: str) -> None:
    """`reset_async` results come from `poll` (ready first, mixed with turns) and equal a
    blocking `reset`'s; a reset in flight holds its envs like a turn does."""
    with EnvPool("trivial", env_num=4, group_n=2, seed=3, backend=backend,
                 num_workers=2) as pool, \
            EnvPool("trivial", env_num=4, group_n=2, seed=3, backend="sequential") as ref:
        pool.reset(seed=9)
        ref.reset(seed=9)
        pool.step_async([0, 1], [["a"], ["b"]])
        pool.reset_async(seed=20, env_ids=[4, 5, 6, 7])
        with pytest.raises(RuntimeError, match="in flight"):
            pool.step_async([4], [["c"]])
        got: dict[int, Any] = {}
        while pool.in_flight:
            got.update(pool.poll(timeout=30.0))
        obs, infos = ref.reset(seed=20, env_ids=[4, 5, 6, 7])
        assert all(isinstance(got[i], ResetResult) for i in (4, 5, 6, 7))
        assert [got[i].obs for i in (4, 5, 6, 7)] == obs
        assert [got[i].info for i in (4, 5, 6, 7)] == infos
        assert [got[i] for i in (0, 1)] == ref.step_turns([["a"], ["b"]], env_ids=[0, 1])
        assert pool.env_seeds == ref.env_seeds


def test_reset_async_gives_each_group_its_own_seed_in_one_call() -> None:
    """A group -> seed mapping starts each group as a reset to that seed would (members
    alike), on any worker; a group of ``env_ids`` missing from it is refused."""
    import turnpool

    with EnvPool("sokoban", env_num=6, group_n=2, seed=3, backend="process",
                 num_workers=2) as pool:
        pool.reset_async(seed={0: 41, 2: 7}, env_ids=[0, 1, 4, 5])
        got: dict[int, Any] = {}
        while pool.in_flight:
            got.update(pool.poll(timeout=30.0))
        for env_id, seed in ((0, 41), (1, 41), (4, 7), (5, 7)):
            assert got[env_id].obs == turnpool.make("sokoban").reset(seed=seed)[0]
        assert [pool.env_seeds[i] for i in (0, 1, 4, 5)] == [41, 41, 7, 7]
        with pytest.raises(ValueError, match="no seed for groups"):
            pool.reset_async(seed={0: 1}, env_ids=[0, 2])
