"""The slot engine: one pool leased to many single-env users, blocking and asyncio faces."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import queue
import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import turnpool
from turnpool.pool.slots import (
    PoolFull,
    PoolTimeout,
    ResetSlotRequest,
    SlotEngine,
    StepSlotRequest,
)
from turnpool.worker.results import ResetResult, TurnResult

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


def test_a_lease_near_a_slot_takes_its_worker_only_while_that_stays_balanced() -> None:
    """A fork's slot prefers its source's worker (one worker message) while that worker's
    load is within one slot's cost of the least loaded one; past that, placement wins."""
    with SlotEngine("sokoban", capacity=8, backend="thread", num_workers=2) as engine:
        worker = {i: w for w, ids in enumerate(engine.pool.backend.slices) for i in ids}
        src = engine.lease()
        near = engine.lease(near=src)  # loads 1 / 0: within one slot's cost
        assert worker[near] == worker[src]
        farther = engine.lease(near=src)  # loads 2 / 0: the other worker
        assert worker[farther] != worker[src]
        assert worker[engine.lease()] != worker[src]  # loads 2 / 2 -> plain placement


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


# ---------------------------------------------------------------------- the driver's inbox
# Unit tests of the driver's state machine: typed requests in, one fake pool (no processes)
# whose turns finish when the test says so.
class FakePool:
    """A `SlotPool` of ``n`` envs over two workers that records every call; a turn or a
    reset finishes when `finish` hands its result to the driver's next poll."""

    backend_name = "fake"

    def __init__(self, n: int = 4) -> None:
        self.num_envs = n
        self.env_seeds: list[int | None] = [None] * n
        self.worker_slices = [list(range(n // 2)), list(range(n // 2, n))]
        self.calls: list[tuple[Any, ...]] = []
        self._ready: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
        self.closed = False

    def worker_nodes(self) -> list[str | None]:
        return [None, None]

    def owner_of(self, env_id: int) -> int:
        return 0 if env_id < self.num_envs // 2 else 1

    def step_async(self, env_ids: list[int], action_lists: list[Any]) -> None:
        self.calls.append(("step", list(env_ids), list(action_lists)))

    def reset_async(self, seed: int | dict[int, int] | None, env_ids: list[int]) -> None:
        self.calls.append(("reset", seed, list(env_ids)))
        for i in env_ids:
            self.env_seeds[i] = seed[i] if isinstance(seed, dict) else \
                (seed if seed is not None else 100) + i

    def forget(self, env_ids: list[int]) -> None:
        self.calls.append(("forget", list(env_ids)))

    def poll(self, timeout: float, min_ready: int) -> list[tuple[int, Any]]:
        try:
            out = [self._ready.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                out.append(self._ready.get_nowait())
            except queue.Empty:
                return out

    def wait_fds(self) -> tuple[list[int], bool] | None:
        return None  # no fds: the driver polls

    def finish(self, slot: int, result: Any) -> None:
        self._ready.put((slot, result))

    def close(self) -> None:
        self.closed = True


def _turn(obs: str, error: str | None = None, info: dict[str, Any] | None = None
          ) -> TurnResult:
    return TurnResult(obs, 1.0, False, False, info or {}, 1 if error is None else 0, error)


@pytest.fixture()
def fake() -> Iterator[tuple[SlotEngine, FakePool]]:
    pool = FakePool()
    engine = SlotEngine("trivial", capacity=pool.num_envs, slot_pool=pool)
    try:
        yield engine, pool
    finally:
        engine.close()


def _waiter() -> concurrent.futures.Future[Any]:
    return concurrent.futures.Future()


def test_steps_submitted_together_reach_the_pool_as_one_call(fake: Any) -> None:
    engine, pool = fake
    a, b = engine.lease(), engine.lease()
    fa, fb = _waiter(), _waiter()
    engine.submit(StepSlotRequest(a, ["up"], fa), StepSlotRequest(b, ["down"], fb))
    pool.finish(b, _turn("b moved"))
    assert fb.result(WAIT_S).obs == "b moved"
    pool.finish(a, _turn("a moved"))
    assert fa.result(WAIT_S).obs == "a moved"
    assert [c for c in pool.calls if c[0] == "step"] == [("step", [a, b], [["up"], ["down"]])]
    assert engine.batches_total == 1 and engine.steps_total == 2


def test_a_result_reaches_its_caller_while_another_slot_is_still_running(fake: Any) -> None:
    engine, pool = fake
    slow, quick = engine.lease(), engine.lease()
    f_slow, f_quick = _waiter(), _waiter()
    engine.submit(StepSlotRequest(slow, ["x"], f_slow), StepSlotRequest(quick, ["x"], f_quick))
    pool.finish(quick, _turn("quick"))
    assert f_quick.result(WAIT_S).obs == "quick"
    assert not f_slow.done()
    pool.finish(slow, _turn("slow"))
    assert f_slow.result(WAIT_S).obs == "slow"


def test_a_second_call_for_a_busy_slot_is_refused_alone(fake: Any) -> None:
    engine, pool = fake
    slot = engine.lease()
    first, second = _waiter(), _waiter()
    engine.submit(StepSlotRequest(slot, ["a"], first), StepSlotRequest(slot, ["b"], second))
    with pytest.raises(RuntimeError, match="still running a call"):
        second.result(WAIT_S)
    pool.finish(slot, _turn("a done"))
    assert first.result(WAIT_S).obs == "a done"


def test_seeded_resets_reach_the_pool_as_one_call_each_slot_with_its_seed(fake: Any) -> None:
    engine, pool = fake
    slots = [engine.lease() for _ in range(4)]
    seeded, seeded2, free1, free2 = _waiter(), _waiter(), _waiter(), _waiter()
    engine.submit(ResetSlotRequest(slots[0], 10, seeded), ResetSlotRequest(slots[1], None, free1),
                  ResetSlotRequest(slots[2], None, free2), ResetSlotRequest(slots[3], 7, seeded2))
    for s in slots:
        pool.finish(s, ResetResult(f"start {s}", {}, None))
    assert seeded.result(WAIT_S) == (f"start {slots[0]}", {}, 10, None, None)
    assert seeded2.result(WAIT_S).seed == 7
    assert free1.result(WAIT_S).seed == 100 + slots[1]
    resets = [c for c in pool.calls if c[0] == "reset"]
    # the seeded ones in one pool call, each slot to its own seed; seedless ones share another
    assert sorted(resets, key=str) == sorted([("reset", {slots[0]: 10, slots[3]: 7},
                                               [slots[0], slots[3]]),
                                              ("reset", None, [slots[1], slots[2]])], key=str)
    assert engine.resets_total == 4


def test_a_failed_turn_is_answered_and_counted_by_its_failure_class(fake: Any) -> None:
    engine, pool = fake
    slot = engine.lease()
    fut = _waiter()
    engine.submit(StepSlotRequest(slot, ["x"], fut))
    pool.finish(slot, _turn("", error="stuck", info={"failure": "timeout"}))
    res = fut.result(WAIT_S)
    assert res.error == "stuck" and res.failure == "timeout"
    assert engine.failures == {"timeout": 1}
    assert engine.recent_failures[-1]["error"] == "stuck"


def test_a_released_slot_is_forgotten_by_the_pool_before_its_next_reset(fake: Any) -> None:
    engine, pool = fake
    slot = engine.lease()
    engine.release(slot)
    again = engine.lease()
    assert again == slot  # the most recently released slot of its worker comes back first
    fut = _waiter()
    engine.submit(ResetSlotRequest(again, 5, fut))
    pool.finish(again, ResetResult("fresh", {}, None))
    assert fut.result(WAIT_S).obs == "fresh"
    ops = [c[0] for c in pool.calls]
    assert ops.index("forget") < ops.index("reset")
    assert pool.calls[ops.index("forget")] == ("forget", [slot])


def test_a_request_for_a_slot_not_leased_is_refused_before_the_inbox(fake: Any) -> None:
    engine, pool = fake
    leased = engine.lease()
    with pytest.raises(ValueError, match="not leased"):
        engine.submit(StepSlotRequest(leased, ["a"], _waiter()),
                      StepSlotRequest(leased + 1, ["b"], _waiter()))
    assert pool.calls == []  # all or none


def test_closing_the_engine_answers_every_call_still_in_flight(fake: Any) -> None:
    engine, pool = fake
    slot = engine.lease()
    fut = _waiter()
    engine.submit(StepSlotRequest(slot, ["x"], fut))
    engine.close()
    with pytest.raises(RuntimeError, match="closed"):
        fut.result(WAIT_S)
    assert pool.closed


def test_leases_go_to_the_worker_whose_leased_slots_cost_least(fake: Any) -> None:
    engine, pool = fake
    first = engine.lease()
    assert engine.worker_of(first) == 0
    second = engine.lease()  # by count while nothing is measured: the other worker
    assert engine.worker_of(second) == 1
    engine.cost[first] = 0.5  # worker 0's session measured expensive, worker 1's cheap
    engine.cost[second] = 0.01
    engine.rebalance()
    assert engine.load == [0.5, 0.01]
    third = engine.lease()
    assert engine.worker_of(third) == 1
    assert engine.slots_of(1) == pool.worker_slices[1]
