"""The slot engine: one pool leased to many single-env users, blocking and asyncio faces."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import pytest

import turnpool
from turnpool.pool.slots import PoolFull, PoolTimeout, SlotEngine

WAIT_S = 60.0


def _episode(env: turnpool.TextEnv, seed: int, actions: list[str]) -> list[str]:
    out = [env.reset(seed=seed)[0]]
    out += [env.step(a)[0] for a in actions]
    return out


def test_one_rule_when_full_and_leases_come_back_most_recent_first() -> None:
    with SlotEngine("trivial", capacity=2, backend="sequential") as engine:
        a, b = engine.lease(), engine.lease()
        assert {a, b} == {0, 1} and engine.leased == 2
        with pytest.raises(PoolFull, match="all 2 env slots"):
            engine.lease()
        engine.release(a)
        engine.release(a)  # idempotent
        assert engine.leased == 1
        assert engine.lease() == a
        engine.release(b)
        with pytest.raises(ValueError, match="not leased"):
            engine.submit_step(b, ["x"])


@pytest.mark.parametrize("backend", ["sequential", "process"])
def test_blocking_face_plays_exact_seeded_episodes_from_many_threads(backend: str) -> None:
    """Eight threads, each its own slot and seed, all get the episode `make` gives."""
    actions = ["Up", "Left", "Down", "Right", "Up"]
    with SlotEngine("sokoban", capacity=8, backend=backend, num_workers=2) as engine:
        got: dict[int, list[str]] = {}

        def play(seed: int) -> None:
            slot = engine.lease()
            reset = engine.submit_reset(slot, seed).result(WAIT_S)
            assert reset.error is None and reset.seed == seed
            trace = [reset.obs]
            for a in actions:
                trace.append(engine.submit_step(slot, [a]).result(WAIT_S).obs)
            got[seed] = trace
            engine.release(slot)

        threads = [threading.Thread(target=play, args=(100 + k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S)
        assert engine.resets_total == 8 and engine.steps_total == 8 * len(actions)
    env = turnpool.make("sokoban")
    for seed, trace in got.items():
        assert trace == _episode(env, seed, actions)
    assert len(got) == 8


def test_asyncio_face_batches_steps_and_refuses_a_second_call_on_a_busy_slot() -> None:
    async def main(engine: SlotEngine) -> None:
        slots = [engine.lease() for _ in range(4)]
        resets = await asyncio.gather(*(engine.reset(s, 7 + s, timeout=WAIT_S)
                                         for s in slots))
        assert [r.seed for r in resets] == [7 + s for s in slots]
        before = engine.batches_total
        results = await asyncio.gather(*(engine.step(s, ["a", "bb"], timeout=WAIT_S)
                                          for s in slots))
        assert all(r.error is None and r.n_executed == 2 for r in results)
        # four users stepping at once cost fewer pool calls than users
        assert engine.batches_total - before < 4
        first = asyncio.ensure_future(engine.step(slots[0], ["a"], timeout=WAIT_S))
        second = asyncio.ensure_future(engine.step(slots[0], ["a"], timeout=WAIT_S))
        done = await asyncio.gather(first, second, return_exceptions=True)
        errors = [d for d in done if isinstance(d, BaseException)]
        assert len(errors) == 1 and "still running a call" in str(errors[0])

    with SlotEngine("trivial", capacity=4, backend="thread", num_workers=2) as engine:
        asyncio.run(main(engine))


def test_a_slow_env_does_not_hold_back_another_slot_and_a_timed_out_slot_is_retired() -> None:
    """Ready-first: a slot whose env hangs gets PoolTimeout (and is never leased again) while
    another slot's step on another worker comes back meanwhile."""
    async def main(engine: SlotEngine) -> None:
        hung, quick = engine.lease(), engine.lease()
        await engine.reset(hung, 1, timeout=WAIT_S)
        await engine.reset(quick, 2, timeout=WAIT_S)
        slow = asyncio.ensure_future(engine.step(hung, ["hang"], timeout=1.0))
        fast = await engine.step(quick, ["fine"], timeout=WAIT_S)
        assert fast.error is None and not slow.done()
        with pytest.raises(PoolTimeout):
            await slow
        engine.release(hung)
        assert hung in engine.lost_slots
        assert engine.lease() != hung

    with SlotEngine("turnpool.envs.synthetic:FaultyEnv", capacity=3, backend="process",
                    num_workers=3, step_timeout=None) as engine:
        asyncio.run(main(engine))


def test_failures_are_counted_by_class_and_calls_after_close_are_refused() -> None:
    engine = SlotEngine("turnpool.envs.synthetic:FaultyEnv", capacity=2, backend="sequential")
    slot = engine.lease()
    engine.submit_reset(slot, 3).result(WAIT_S)
    res = engine.submit_step(slot, ["raise"]).result(WAIT_S)
    assert res.failure == "env_error" and res.info["failure"] == "env_error"
    assert engine.failures["env_error"] == 1
    engine.close()
    engine.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        engine.submit_step(slot, ["x"])
    with pytest.raises(RuntimeError, match="closed"):
        engine.lease()


def test_leases_spread_over_workers_and_follow_the_measured_cost() -> None:
    """Placement: by count while nothing is measured, then by each worker's measured cost, so
    new sessions avoid the worker whose sessions are expensive."""
    with SlotEngine("faulty", capacity=12, backend="thread", num_workers=2,
                    env_kwargs={"episode_len": 1000}) as engine:
        worker = {i: w for w, ids in enumerate(engine.pool.backend.slices) for i in ids}
        first = [engine.lease() for _ in range(4)]
        assert sorted(worker[s] for s in first) == [0, 0, 1, 1]
        slow = next(s for s in first if worker[s] == 0)
        for s in first:
            engine.submit_reset(s, seed=s).result(timeout=WAIT_S)
        for _ in range(2):
            futures = [engine.submit_step(s, ["slow" if s == slow else "go"]) for s in first]
            assert all(f.result(timeout=WAIT_S).error is None for f in futures)
        # a step's cost is its time from send to result: the slow env's worker-mate waits
        # behind it, so worker 0 as a whole is the expensive one
        cheap = [s for s in first if worker[s] == 1]
        assert engine.cost[slow] > 0.25 > 10 * max(engine.cost[s] for s in cheap)
        engine.rebalance()
        assert engine.load[0] > engine.load[1]
        nxt = [engine.lease() for _ in range(2)]
        assert [worker[s] for s in nxt] == [1, 1]  # the cheap worker takes the new sessions
        engine.release(slow)  # the expensive session leaves; its mate's steps get cheap
        mate = next(s for s in first if worker[s] == 0 and s != slow)
        for _ in range(40):
            assert engine.submit_step(mate, ["go"]).result(timeout=WAIT_S).error is None
        engine.rebalance()
        assert engine.load[0] < engine.load[1]
        assert worker[engine.lease()] == 0


def test_a_released_slot_stops_holding_the_replay_log() -> None:
    """A session that ends mid-episode must not pin its worker's replay log (which then grows
    with every step of every other session, and makes each restore after a worker loss slower
    and slower): releasing the slot forgets its episode."""
    with SlotEngine("trivial", capacity=2, backend="process", num_workers=1,
                    env_kwargs={"episode_len": 1000}) as engine:
        a, b = engine.lease(), engine.lease()
        for s in (a, b):
            engine.submit_reset(s, seed=s).result(timeout=WAIT_S)
        for _ in range(5):
            engine.submit_step(b, ["x"]).result(timeout=WAIT_S)
        engine.release(b)  # its session left mid-episode
        replay = engine.pool._dispatch.replay
        for episode in range(3):
            engine.submit_reset(a, seed=10 + episode).result(timeout=WAIT_S)
            for _ in range(10):
                assert engine.submit_step(a, ["y"]).result(timeout=WAIT_S).error is None
        assert replay.seeds[b] is None
        assert replay.held(0) == 10  # only a's current episode
        # and a's episode still comes back exactly after its worker is lost
        reference = turnpool.make("trivial", episode_len=1000)
        reference.reset(seed=12)
        want = [reference.step("y")[0] for _ in range(11)][-1]
        victim = engine.pool.worker_pids()[0]
        os.kill(victim, signal.SIGKILL)
        assert engine.submit_step(a, ["y"]).result(timeout=WAIT_S).obs == want
