"""No head-of-line blocking on the process backend: an env that stalls holds back only itself.

Real worker processes run the ``faulty`` env: ``"hang"`` blocks in ``time.sleep`` (releases
the GIL), ``"slow"`` takes 0.3 s and then steps normally, ``"hang_gil"`` blocks inside C code
that holds the GIL. Results are compared with a sequential pool on the same seeds.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.faults import GONE_S, RESTART_S, wait_gone
from turnpool.pool import EnvPool
from turnpool.worker.handoff import MAX_STUCK_THREADS

pytestmark = pytest.mark.timeout(120)

STEP_TIMEOUT = 4.0
N = 8  # envs 0-3 on worker 0, 4-7 on worker 1
STUCK = 1  # shares worker 0 with envs 0, 2 and 3


def _pool(**options: Any) -> EnvPool:
    return EnvPool("faulty", env_num=N, seed=3, backend="process", num_workers=2,
                   step_timeout=options.pop("step_timeout", STEP_TIMEOUT),
                   env_kwargs={"episode_len": 1000}, **options)


@pytest.fixture(scope="module")
def pool() -> Iterator[EnvPool]:
    p = _pool()
    yield p
    p.close()


@pytest.fixture()
def reference() -> Iterator[EnvPool]:
    p = EnvPool("faulty", env_num=N, seed=3, backend="sequential",
                env_kwargs={"episode_len": 1000})
    yield p
    p.close()


def _arrivals(pool: EnvPool, actions: list[str]) -> dict[int, tuple[float, Any]]:
    """Step every env with ``actions`` (async) and note when each result arrived."""
    t0 = time.monotonic()
    pool.step_async(list(range(N)), [[a] for a in actions])
    got: dict[int, tuple[float, Any]] = {}
    while len(got) < N:
        for i, r in pool.poll(timeout=STEP_TIMEOUT + 5):
            got[i] = (time.monotonic() - t0, r)
    return got


def test_worker_mates_of_a_hung_env_are_answered_long_before_its_deadline(
        pool: EnvPool, reference: EnvPool) -> None:
    assert pool.reset(seed=11) == reference.reset(seed=11)
    warm = [f"w{i}" for i in range(N)]
    assert pool.step(warm) == reference.step(warm)
    pids = pool.worker_pids()
    actions = ["go"] * N
    actions[STUCK] = "hang"
    got = _arrivals(pool, actions)
    ref = reference.step_turns([["go"]] * N)
    stuck_s, stuck = got[STUCK]
    for i in range(N):
        if i == STUCK:
            continue
        seconds, result = got[i]
        # not held until the deadline: answered by an earlier poll than the stuck env
        assert seconds < stuck_s, (i, seconds, stuck_s)
        assert result == ref[i]  # and exactly what a clean run gives
    assert stuck.failure == "timeout" and "step timeout" in stuck.error
    # the deadline fired, not before it was due (the hang itself lasts an hour)
    assert STEP_TIMEOUT - 0.5 < stuck_s < STEP_TIMEOUT + RESTART_S
    # the worker answered the timeout itself: it was not killed, nobody was replayed
    assert pool.worker_pids()[:2] == pids[:2]
    # the others keep going exactly; the stuck env is failed until its reset
    others = [i for i in range(N) if i != STUCK]
    assert pool.step(["x"] * (N - 1), env_ids=others) == reference.step(
        ["x"] * (N - 1), env_ids=others)
    again = pool.step_turns([["x"]], env_ids=[STUCK])[0]
    assert again.failure == "timeout"
    assert pool.reset(seed=12) == reference.reset(seed=12)
    assert pool.step(warm) == reference.step(warm)


def test_a_slow_env_is_answered_late_and_its_history_survives_a_restart(
        pool: EnvPool, reference: EnvPool) -> None:
    assert pool.reset(seed=21) == reference.reset(seed=21)
    actions = ["go"] * N
    actions[STUCK] = "slow"  # 0.3 s, then a normal step: longer than the hand-off wait
    got = _arrivals(pool, actions)
    ref = reference.step_turns([[a] for a in actions])
    assert [got[i][1] for i in range(N)] == ref
    assert got[STUCK][0] > 0.25
    assert max(got[i][0] for i in (0, 2, 3)) < got[STUCK][0]  # its mates came first
    # Kill worker 0 from outside: its envs come back by replay, the late step included.
    victim = pool.worker_pids()[0]
    os.kill(victim, signal.SIGKILL)
    assert wait_gone([victim], GONE_S) == []
    nxt = [f"n{i}" for i in range(N)]
    assert pool.step(nxt) == reference.step(nxt)


def test_a_straggler_on_a_worker_that_dies_is_retried_exactly(
        pool: EnvPool, reference: EnvPool) -> None:
    """Env 1 is slow (a straggler) when env 0's step kills the worker: env 0 is blamed, env 1's
    turn is sent again after the restore and comes out as in a clean run."""
    assert pool.reset(seed=31) == reference.reset(seed=31)
    pool.step_async([STUCK], [["slow"]])
    # one request per worker is on the wire: this one goes out when the first is answered in
    # part, i.e. while env 1 is a straggler
    pool.step_async([0], [["exit"]])
    got: dict[int, Any] = {}
    while len(got) < 2:
        for i, r in pool.poll(timeout=STEP_TIMEOUT + 5):
            got[i] = r
    assert got[0].failure == "worker_lost"
    assert got[STUCK] == reference.step_turns([["slow"]], env_ids=[STUCK])[0]
    rest = [i for i in range(N) if i != 0]
    assert pool.step(["z"] * len(rest), env_ids=rest) == reference.step(
        ["z"] * len(rest), env_ids=rest)


def test_a_hang_holding_the_gil_still_gets_the_worker_replaced(
        pool: EnvPool, reference: EnvPool) -> None:
    assert pool.reset(seed=41) == reference.reset(seed=41)
    pids = pool.worker_pids()
    actions = ["go"] * N
    actions[STUCK] = "hang_gil"
    t0 = time.monotonic()
    results = pool.step_turns([[a] for a in actions])
    assert time.monotonic() - t0 < STEP_TIMEOUT + RESTART_S  # the hang lasts an hour
    assert results[STUCK].failure == "timeout"
    assert pool.worker_pids()[0] != pids[0]
    ref = reference.step_turns([["go"]] * N)
    assert [r for i, r in enumerate(results) if i != STUCK] == [
        r for i, r in enumerate(ref) if i != STUCK]


def test_without_handoff_the_mates_wait_for_the_deadline() -> None:
    with _pool(handoff_after=None, step_timeout=1.5) as p:
        p.reset(seed=5)
        actions = ["go"] * N
        actions[STUCK] = "hang"
        t0 = time.monotonic()
        p.step_async(list(range(N)), [[a] for a in actions])
        got: dict[int, float] = {}
        while len(got) < N:
            for i, _r in p.poll(timeout=10):
                got[i] = time.monotonic() - t0
        held = min(got[i] for i in (0, 2, 3))
        assert held >= 1.4  # the behaviour hand-off removes: the mates waited for the deadline
        # the other worker never waited: all its envs were answered before any mate was
        assert max(got[i] for i in (4, 5, 6, 7)) < held


def test_a_worker_full_of_stuck_threads_is_replaced() -> None:
    """After `MAX_STUCK_THREADS` given-up threads the worker stops handing off, so the next
    hang gets it killed (which frees the threads). Every env of worker 0 hangs at once, so
    each round leaves one stuck thread per env."""
    n = 32  # 16 envs per worker
    # The 16 envs of a request hang one after another, each handed off ``handoff_after``
    # (0.05 s) after it starts; the pool sees the request stuck when no env started within
    # ``step_timeout``. 1.5 s leaves a loaded single core room for each hand-off (at 0.3 s
    # one came late under `taskset -c 0`, and the pool killed the worker).
    with EnvPool("faulty", env_num=n, seed=3, backend="process", num_workers=2,
                 step_timeout=1.5, env_kwargs={"episode_len": 1000}) as p:
        mine = p.backend.slices[0]
        p.reset(seed=1)
        pid = p.worker_pids()[0]
        stuck = 0
        while stuck < MAX_STUCK_THREADS:
            results = p.step_turns([["hang"]] * len(mine), env_ids=mine)
            assert all(r.failure == "timeout" for r in results)
            stuck += len(mine)
            assert p.worker_pids()[0] == pid, stuck  # given up by the worker, not killed
            p.reset(seed=2, env_ids=mine)
        r = p.step_turns([["hang"]], env_ids=[mine[0]])[0]
        assert r.failure == "timeout"
        assert p.worker_pids()[0] != pid
        assert all(r.error is None for r in p.step_turns([["go"]] * n)[1:])


def test_a_hung_straggler_is_sent_again_once_when_workers_keep_dying() -> None:
    """A hung env whose worker dies (another env's fault) is sent again once; if that worker
    dies too, it fails ``worker_lost`` at once instead of starting its deadline over and over
    (which lost sessions under a soak with frequent worker deaths)."""
    with _pool(step_timeout=30.0) as p:
        p.reset(seed=4)
        # each request goes out when the one before is answered in part, i.e. while env 1
        # hangs as a straggler
        p.step_async([STUCK], [["hang"]])
        p.step_async([0], [["exit"]])
        p.step_async([2], [["exit"]])
        t0 = time.monotonic()
        got: dict[int, Any] = {}
        while len(got) < 3:
            for i, r in p.poll(timeout=20):
                got[i] = (time.monotonic() - t0, r)
        assert got[0][1].failure == "worker_lost" and got[2][1].failure == "worker_lost"
        seconds, hung = got[STUCK]
        assert hung.failure == "worker_lost"
        assert seconds < 30.0  # failed before its deadline, let alone one restarted per death
        assert p.step_turns([["go"]], env_ids=[3])[0].error is None
