"""Slots: one `EnvPool` of single-env groups leased to many independent users.

A server session, a TRL tool environment and a verl agent-loop coroutine each drive one env,
one call at a time, from their own thread or event loop, while `EnvPool` is not thread-safe
and its calls block. `SlotEngine` puts the pool on one driver thread and lends its envs out
as *slots*:

* ``lease()`` gives a free slot or raises `PoolFull`; ``release(slot)`` gives it back. The
  one rule when full is that exception, whoever asks. Placement is cost-aware: each slot's
  step cost is measured (a moving average of its steps' time from send to result), and a new
  lease goes to the worker whose leased slots cost least in total (by count until anything is
  measured; `turnpool.pool.cost`), so a mix of cheap and expensive sessions stays balanced
  over the workers; within a worker, the most recently released slot first (its env is
  warm).
* Calls go through the inbox of the driver thread (`turnpool.pool.slot_driver`), which sends
  every step waiting as one pool call and collects turns and resets ready-first, so one slow
  env never holds back another slot's result.
* Typed requests in: `SlotEngine.submit` takes `StepSlotRequest` / `ResetSlotRequest` /
  branching records, each with the future to resolve, and checks their slots first;
  `SlotEngine.post` takes a batch already checked (the WebSocket fast path, whose futures
  must hear back even when a slot was released meanwhile). Thin faces over `submit`:
  blocking (``submit_reset`` / ``submit_step`` return a `concurrent.futures.Future`) and
  asyncio (``await reset(...)`` / ``await step(...)``, or ``reset_future`` /
  ``step_future`` with no timeout of their own), whose results reach each event loop in one
  thread-safe callback per round, not one per result.

Seeds: slot ``i`` is group ``i`` of the pool; a reset of slot ``i`` to seed ``s`` gives group
``i`` seed ``s`` (`EnvPool.reset_async` with a group -> seed mapping), so the env starts
exactly as ``turnpool.make(env).reset(seed=s)``. A seedless reset follows the pool's own
schedule and reports the seed it used. Everything the pool does holds here too:
``step_timeout`` per env turn, a dead or stuck worker replaced with only its culprit failed,
every backend.

Example:
    >>> engine = SlotEngine("bandit", capacity=2, backend="sequential")
    >>> slot = engine.lease()
    >>> engine.submit_reset(slot, seed=3).result(timeout=30).error is None
    True
    >>> engine.submit_step(slot, ["dragon"]).result(timeout=30).terminated
    True
    >>> engine.release(slot); engine.close()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import Any

import turnpool.pool.cost as cost_model
from turnpool.envs.registry import EnvTarget
from turnpool.pool.api import EnvPool
from turnpool.pool.slot_driver import SlotDriver
from turnpool.pool.slot_requests import (
    Branched,
    BranchRequest,
    EnvPoolSlots,
    PoolFull,
    PoolTimeout,
    ReleaseRequest,
    ResetSlotRequest,
    SlotPool,
    SlotRequest,
    SlotReset,
    StepSlotRequest,
    Waiter,
)
from turnpool.worker.results import TurnResult


class SlotEngine:
    """``capacity`` single-env slots of one env type on one `EnvPool`, driven by one thread.

    ``pool_options`` go to `EnvPool` (``backend``, ``num_workers``, ``step_timeout``, ...);
    ``slot_pool`` replaces the pool (a fake, in unit tests). Leases and calls are
    thread-safe; the pool itself is only touched by the driver thread.
    """

    def __init__(self, env_type: EnvTarget, *, capacity: int,
                 env_kwargs: dict[str, Any] | None = None, seed: int = 0,
                 slot_pool: SlotPool | None = None, **pool_options: Any) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
        if pool_options.get("on_error", "flag") != "flag":
            raise ValueError("a SlotEngine reports failures in its results: on_error must be "
                             "'flag'")
        self.env_type = env_type
        #: the `EnvPool` (None when a `SlotPool` was given)
        self.pool: EnvPool | None = None
        if slot_pool is None:
            self.pool = EnvPool(env_type, env_num=capacity, group_n=1, seed=seed,
                                env_kwargs=dict(env_kwargs or {}), **pool_options)
            slot_pool = EnvPoolSlots(self.pool)
        self._slots: SlotPool = slot_pool
        self._lock = threading.Lock()
        slices = self._slots.worker_slices
        #: per worker its free slots (most recently released first); which worker holds a
        #: slot is the pool's to say (`worker_of`)
        self._free: list[deque[int]] = [deque(ids) for ids in slices]
        self._leased: set[int] = set()
        #: per slot, its moving-average step cost in seconds (0: not measured yet)
        self.cost: list[float] = [0.0] * self._slots.num_envs
        #: per worker, the cost of its leased slots (unmeasured ones count the mean)
        self.load: list[float] = [0.0] * len(slices)
        self._mean_cost = 1.0
        #: slots whose call outlived its caller's timeout (never leased again)
        self.lost_slots: set[int] = set()
        self._closed = False
        self._driver = SlotDriver(self._slots, self.cost, self.rebalance)

    # ------------------------------------------------------------------ leases
    @property
    def capacity(self) -> int:
        return self._slots.num_envs

    @property
    def num_workers(self) -> int:
        return len(self.load)

    @property
    def leased(self) -> int:
        """How many slots are leased now."""
        return len(self._leased)

    def worker_of(self, slot: int) -> int:
        """The worker whose envs include ``slot``'s."""
        return self._slots.owner_of(slot)

    def slots_of(self, worker: int) -> list[int]:
        """The slots whose envs ``worker`` runs."""
        return list(self._slots.worker_slices[worker])

    @property
    def backend_name(self) -> str:
        return self._slots.backend_name

    # counters, written by the driver, read (racily, for display) by anyone
    @property
    def steps_total(self) -> int:
        return self._driver.steps_total

    @property
    def resets_total(self) -> int:
        return self._driver.resets_total

    @property
    def batches_total(self) -> int:
        return self._driver.batches_total

    @property
    def failures(self) -> Counter[str]:
        return self._driver.failures

    @property
    def recent_failures(self) -> deque[dict[str, Any]]:
        return self._driver.recent_failures

    def worker_nodes(self) -> list[str | None]:
        """Where each worker runs (on Ray: its node; else None)."""
        return self._slots.worker_nodes()

    def lease(self, near: int | None = None) -> int:
        """A free slot on the least loaded worker; `PoolFull` when every slot is leased.
        ``near`` (a leased slot: a fork's source) prefers that slot's worker while its load
        is within one slot's mean cost of the least loaded one's, so a fork there is one
        worker message (`EnvPool.fork`) without crowding one worker."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the slot engine is closed")
            best = cost_model.least_loaded(self.load, [bool(f) for f in self._free])
            if best is None:
                raise PoolFull(f"all {self.capacity} env slots are leased")
            if near is not None:
                w = self._slots.owner_of(near)
                if self._free[w] and self.load[w] <= self.load[best] + self._mean_cost:
                    best = w
            slot = self._free[best].popleft()
            self._leased.add(slot)
            self.load[best] += self.cost[slot] or self._mean_cost
            return slot

    def release(self, slot: int) -> None:
        """Give a slot back (idempotent); it is its worker's next one leased."""
        with self._lock:
            if slot in self._leased:
                self._leased.discard(slot)
                w = self._slots.owner_of(slot)
                self.load[w] = max(0.0, self.load[w] - (self.cost[slot] or self._mean_cost))
                if slot not in self.lost_slots:
                    self._free[w].appendleft(slot)
                if not self._closed:  # its episode is over for the pool too
                    self._put(ReleaseRequest(slot))

    def rebalance(self) -> None:
        """Recount each worker's load from the leased slots' measured costs (the driver does
        this every `turnpool.pool.slot_driver.REBALANCE_EVERY` s; leases and releases adjust
        it in between)."""
        with self._lock:
            cost = self.cost
            known = [cost[s] for s in self._leased if cost[s] > 0.0]
            if known:
                self._mean_cost = cost_model.mean_of(sum(known), len(known))
            measured = [0.0] * len(self.load)
            unmeasured = [0] * len(self.load)
            owner_of = self._slots.owner_of
            for s in self._leased:
                if cost[s] > 0.0:
                    measured[owner_of(s)] += cost[s]
                else:
                    unmeasured[owner_of(s)] += 1
            self.load = [cost_model.load_of(c, u, self._mean_cost)
                         for c, u in zip(measured, unmeasured, strict=True)]

    def measured_load(self) -> tuple[float, int, int]:
        """(summed cost of the leased slots measured so far, how many those are, how many
        slots are leased): a load that other engines can compare, unlike `load`, where
        unmeasured slots count this engine's own mean."""
        with self._lock:
            known = [c for c in map(self.cost.__getitem__, self._leased) if c > 0.0]
            return float(sum(known)), len(known), len(self._leased)

    # ------------------------------------------------------------------ the ways in
    def check(self, slot: int) -> None:
        """`RuntimeError` when the engine is closed, `ValueError` when ``slot`` is not
        leased: what `submit` refuses."""
        if self._closed or not self._driver.driving:
            raise RuntimeError("the slot engine is closed")
        if slot not in self._leased:
            raise ValueError(f"env slot {slot} is not leased")

    def submit(self, *requests: StepSlotRequest | ResetSlotRequest | BranchRequest) -> None:
        """Hand the driver ``requests`` (checked first, all or none): one inbox item, so
        the driver sends their steps in one pool call."""
        for request in requests:
            for slot in request.slots:
                self.check(slot)
        self.post(list(requests))

    def post(self, requests: Sequence[StepSlotRequest | ResetSlotRequest | BranchRequest]
             ) -> None:
        """`submit` of requests already checked (a batch built over one event-loop pass, whose
        futures must hear back even when a slot was released meanwhile)."""
        if len(requests) == 1:
            self._put(requests[0])
        else:  # a list handed over (the batcher's) is the driver's now: no copy
            self._put(requests if isinstance(requests, list) else list(requests))

    def _put(self, item: SlotRequest | list[SlotRequest]) -> None:
        self._driver.put(item)

    # ------------------------------------------------------------------ blocking face
    def submit_reset(self, slot: int, seed: int | None = None
                     ) -> concurrent.futures.Future[SlotReset]:
        """Start an episode in ``slot`` (from ``seed``, or the pool's schedule)."""
        fut: concurrent.futures.Future[SlotReset] = concurrent.futures.Future()
        self.submit(ResetSlotRequest(slot, None if seed is None else int(seed), fut))
        return fut

    def submit_step(self, slot: int, actions: Sequence[Any]
                    ) -> concurrent.futures.Future[TurnResult]:
        """Run ``actions`` in ``slot``, stopping at the first done (cut at ``step_timeout``)."""
        fut: concurrent.futures.Future[TurnResult] = concurrent.futures.Future()
        self.submit(StepSlotRequest(slot, list(actions), fut))
        return fut

    # ------------------------------------------------------------------ asyncio face
    def reset_future(self, slot: int, seed: int | None = None) -> asyncio.Future[SlotReset]:
        """`submit_reset` from a running event loop, as an `asyncio.Future` with no timeout
        (a caller that stops waiting calls `abandon`)."""
        fut: asyncio.Future[SlotReset] = asyncio.get_running_loop().create_future()
        self.submit(ResetSlotRequest(slot, None if seed is None else int(seed), fut))
        return fut

    def step_future(self, slot: int, actions: Sequence[Any]) -> asyncio.Future[TurnResult]:
        """`submit_step` from a running event loop, as an `asyncio.Future` with no timeout."""
        fut: asyncio.Future[TurnResult] = asyncio.get_running_loop().create_future()
        self.submit(StepSlotRequest(slot, list(actions), fut))
        return fut

    def branch_future(self, request: Callable[[Waiter], BranchRequest]) -> asyncio.Future[Any]:
        """Run a branching call on the driver (``request(waiter)``: a `SnapshotSlotRequest`,
        `RestoreSlotRequest` or `ForkSlotRequest`); the future gets its result."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.submit(request(fut))
        return fut

    async def reset(self, slot: int, seed: int | None = None,
                    timeout: float | None = None) -> SlotReset:
        out: SlotReset = await self._wait(slot, self.reset_future(slot, seed), timeout)
        return out

    async def step(self, slot: int, actions: Sequence[Any],
                   timeout: float | None = None) -> TurnResult:
        out: TurnResult = await self._wait(slot, self.step_future(slot, actions), timeout)
        return out

    async def _wait(self, slot: int, fut: asyncio.Future[Any], timeout: float | None) -> Any:
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except asyncio.TimeoutError:
            self.abandon(slot)  # the env may still be in flight
            raise PoolTimeout(f"the pool did not answer within {timeout:g} s") from None

    def abandon(self, slot: int) -> None:
        """A call of ``slot`` outlived its caller's wait: the slot is never leased again
        (its env may still be running)."""
        with self._lock:
            self.lost_slots.add(slot)

    def close(self, timeout: float = 30.0) -> None:
        """Stop the driver and the pool (every worker). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._driver.stop(timeout)
        self._slots.close()

    def __enter__(self) -> SlotEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["BranchRequest", "Branched", "PoolFull", "PoolTimeout", "ReleaseRequest",
           "ResetSlotRequest", "SlotEngine", "SlotPool", "SlotRequest", "SlotReset",
           "StepSlotRequest"]
