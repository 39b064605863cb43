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
* Calls go through an inbox. The driver takes *everything* waiting, sends all steps as one
  `EnvPool.step_async` call (one message per worker, however many users it serves), starts
  the resets in one `EnvPool.reset_async` (each slot to its own seed; seedless ones in a
  second, on the pool's schedule), and collects
  finished turns and resets ready-first with `EnvPool.poll`, so one slow env (or a worker
  busy restoring its envs) never holds back another slot's result. While calls are in
  flight it sleeps until a worker answers or a request comes in (`EnvPool.wait_fds` and the
  inbox's wake pipe, in one ``poll(2)``), not on a timer; while every worker has a request
  out, a request coming in does not wake it (it would only queue behind that request): it is
  sent with the others that came meanwhile when a worker answers, so a busy server sends
  fewer, larger batches. On a backend without fds (threads, Ray) the driver polls the pool
  every `POLL_INTERVAL`.
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
import logging
import os
import queue
import select
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import Any

import turnpool.pool.cost as cost_model
from turnpool.envs.registry import EnvTarget
from turnpool.pool.api import EnvPool
from turnpool.pool.slot_requests import (
    Branched,
    BranchRequest,
    Deliveries,
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
    deliver,
)
from turnpool.worker.failures import Failure
from turnpool.worker.results import ResetResult, TurnResult

log = logging.getLogger(__name__)

#: Seconds the driver waits for a worker reply before it looks at its inbox again, on a
#: backend whose workers give no fds to sleep on (`EnvPool.wait_fds`).
POLL_INTERVAL = 0.001
#: Seconds the driver sleeps at most on fds while calls are in flight: the pool's deadlines
#: (``step_timeout``) are checked when it wakes.
DEADLINE_CHECK = 0.05
#: Seconds the driver sleeps on an empty inbox when nothing is in flight.
IDLE_WAIT = 0.05
#: Seconds between two recounts of each worker's load (the leased slots' measured cost).
REBALANCE_EVERY = 0.5

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
        self._sent: dict[int, float] = {}
        self._rebalanced = 0.0
        #: slots whose call outlived its caller's timeout (never leased again)
        self.lost_slots: set[int] = set()
        self._inbox: queue.SimpleQueue[SlotRequest | list[SlotRequest] | None] = \
            queue.SimpleQueue()
        #: the driver's wake-up: a byte written when a request comes in while it sleeps on
        #: the workers' fds and some worker is free (`_sleeping`)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._sleeping = False
        self._workers_busy = False  # while sleeping: every worker has a request out
        #: the driver's poll object and the fds it has registered (kept while they stay)
        self._poller = select.poll()
        self._polled: tuple[int, ...] = ()
        self._closed = False
        self._driving = True  # False once the driver thread has ended
        # counters, written by the driver, read (racily, for display) by anyone
        self.steps_total = 0
        self.resets_total = 0
        self.batches_total = 0
        self.failures: Counter[str] = Counter()
        self.recent_failures: deque[dict[str, Any]] = deque(maxlen=20)
        self._thread = threading.Thread(target=self._run, name="turnpool-slots", daemon=True)
        self._thread.start()

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
        this every `REBALANCE_EVERY` s; leases and releases adjust it in between)."""
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
        if self._closed or not self._driving:
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

    def _put(self, item: SlotRequest | list[SlotRequest] | None, wake: bool = False) -> None:
        self._inbox.put(item)
        # `_sleeping` is set by the driver before it looks at the inbox a last time
        if self._sleeping and (wake or not self._workers_busy):
            try:
                os.write(self._wake_w, b"\0")
            except (BlockingIOError, OSError):  # full (it will wake) or closed (it stopped)
                pass

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
        self._put(None, wake=True)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("the slot driver did not stop within %.0f s", timeout)
        else:
            os.close(self._wake_r)
            os.close(self._wake_w)
        self._slots.close()

    def __enter__(self) -> SlotEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the driver
    def _run(self) -> None:
        try:
            self._drive()
        finally:
            self._driving = False

    def _drive(self) -> None:
        in_flight: dict[int, Waiter] = {}
        while True:
            wait = self._sleep() if in_flight else 0.0
            items, stop = self._drain(block=not in_flight)
            if stop:
                break
            try:
                self._round(items, in_flight, wait)
            except Exception as exc:  # a bug here must not leave callers waiting forever
                log.exception("the slot driver failed")
                failed = [r.waiter for r in items if not isinstance(r, ReleaseRequest)]
                failed += list(in_flight.values())
                in_flight.clear()
                deliver([(w, None, exc) for w in failed])
        closing = RuntimeError("the slot engine is closed")
        late: list[SlotRequest] = list(items)  # drained with the stop: never sent
        while True:  # and calls that arrived after close
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            late += item if isinstance(item, list) else [item] if item is not None else []
        waiters = list(in_flight.values())
        waiters += [r.waiter for r in late if not isinstance(r, ReleaseRequest)]
        deliver([(w, None, closing) for w in waiters])

    def _sleep(self) -> float:
        """Sleep until a worker with something in flight answers (or dies), a request comes
        in, or `DEADLINE_CHECK` passes; the timeout of this round's pool poll (0: the fds
        said when; `POLL_INTERVAL` on a backend without fds)."""
        waits = self._slots.wait_fds()
        if waits is None:
            return POLL_INTERVAL
        fds, self._workers_busy = waits
        watched = (*fds, self._wake_r)
        if watched != self._polled:  # a worker became busy or idle, or was replaced
            self._poller = select.poll()
            for fd in watched:
                self._poller.register(fd, select.POLLIN)
            self._polled = watched
        self._sleeping = True  # before the last look: a request put after it writes a byte
        ready: list[tuple[int, int]] = []
        try:
            if self._workers_busy or self._inbox.empty():
                ready = self._poller.poll(DEADLINE_CHECK * 1000)
        finally:
            self._sleeping = False
        if any(fd == self._wake_r for fd, _ in ready):  # read the bytes that woke it
            try:
                while os.read(self._wake_r, 4096):
                    pass
            except BlockingIOError:
                pass
        return 0.0

    def _drain(self, block: bool) -> tuple[list[SlotRequest], bool]:
        """Every request waiting in the inbox, and whether `close` asked the driver to stop."""
        items: list[SlotRequest] = []
        try:
            first = self._inbox.get(timeout=IDLE_WAIT) if block else self._inbox.get_nowait()
        except queue.Empty:
            return items, False
        while True:
            if first is None:
                return items, True
            if isinstance(first, list):  # a `submit` of several
                items.extend(first)
            else:
                items.append(first)
            try:
                first = self._inbox.get_nowait()
            except queue.Empty:
                return items, False

    def _round(self, items: list[SlotRequest], in_flight: dict[int, Waiter],
               wait: float = POLL_INTERVAL) -> None:
        """Send the new steps as one pool call, start the resets, run the branching calls,
        collect finished turns (waiting up to ``wait`` s for one)."""
        out: Deliveries = []
        steps: list[StepSlotRequest] = []
        resets: list[ResetSlotRequest] = []
        branches: list[BranchRequest] = []
        released = [r.slot for r in items if isinstance(r, ReleaseRequest)]
        if released:  # before this round's resets, which may start those slots again
            self._slots.forget(released)
        taken: set[int] = set()  # this round's, beside those in flight
        for r in items:
            if isinstance(r, ReleaseRequest):
                continue
            # one slot, most often: no tuple made (the `slots` property's)
            one = isinstance(r, (StepSlotRequest, ResetSlotRequest))
            slots = (r.slot,) if one else r.slots
            busy = [s for s in slots if s in in_flight or s in taken]
            if busy:  # one call at a time per slot; the others are refused alone
                out.append((r.waiter, None, RuntimeError(
                    f"env slot {busy[0]} is still running a call; wait for it first")))
                continue
            taken.update(slots)
            if isinstance(r, StepSlotRequest):
                steps.append(r)
            elif isinstance(r, ResetSlotRequest):
                resets.append(r)
            else:
                branches.append(r)
        if steps:
            out.extend(self._steps(steps, in_flight))
        if resets:
            out.extend(self._resets(resets, in_flight))
        for b in branches:  # blocking, while the steps and resets just sent run
            try:
                out.append((b.waiter, b.run(self._slots), None))
            except Exception as exc:  # bad input or a closed pool: its caller hears it
                out.append((b.waiter, None, exc))
        if in_flight:
            out.extend(self._collect(in_flight, wait))
        if out:
            deliver(out)
        now = time.monotonic()
        if now - self._rebalanced >= REBALANCE_EVERY:
            self._rebalanced = now
            self.rebalance()

    def _steps(self, steps: list[StepSlotRequest], in_flight: dict[int, Waiter]) -> Deliveries:
        """Send every step as one pool call (one message per worker)."""
        try:
            self._slots.step_async([r.slot for r in steps], [r.actions for r in steps])
        except Exception as exc:  # a closed pool: every caller hears it
            return [(r.waiter, None, exc) for r in steps]
        self.batches_total += 1
        now = time.monotonic()
        for r in steps:
            in_flight[r.slot] = r.waiter
            self._sent[r.slot] = now
        return []

    def _resets(self, resets: list[ResetSlotRequest], in_flight: dict[int, Waiter]) -> Deliveries:
        """Start the round's resets as at most two pool calls without waiting: the seeded
        ones in one, each slot with its own seed (one request per worker, not one per
        reset: served sessions reset to seeds of their own), the seedless ones in another,
        on the pool's schedule. Their results come ready-first with the turns', so a reset
        queued behind a slow worker holds back no other slot."""
        seeded = [r for r in resets if r.seed is not None]
        calls: list[tuple[dict[int, int] | None, list[ResetSlotRequest]]] = [
            (None, [r for r in resets if r.seed is None])]
        if seeded:
            calls.append(({r.slot: r.seed for r in seeded if r.seed is not None}, seeded))
        out: Deliveries = []
        for seeds, members in calls:
            if not members:
                continue
            try:
                self._slots.reset_async(seeds, [r.slot for r in members])
            except Exception as exc:
                out.extend((r.waiter, None, exc) for r in members)
                continue
            in_flight.update((r.slot, r.waiter) for r in members)
        return out

    def _collect(self, in_flight: dict[int, Waiter], wait: float) -> Deliveries:
        """The turns and resets finished within ``wait`` s (ready-first); each step's time
        updates its slot's cost."""
        out: Deliveries = []
        ready = self._slots.poll(wait, 1)
        now = time.monotonic()
        cost, sent, updated = self.cost, self._sent, cost_model.updated
        for slot, result in ready:
            waiter = in_flight.pop(slot, None)
            if waiter is None:
                continue
            if isinstance(result, ResetResult):
                out.append((waiter, self._reset_done(slot, result), None))
                continue
            if result.error is None:
                self.steps_total += result.n_executed
            else:
                self._count_failure_of(result)
            out.append((waiter, result, None))
            cost[slot] = updated(cost[slot], now - sent.pop(slot, now))
        return out

    def _reset_done(self, slot: int, result: ResetResult) -> SlotReset:
        error, info = result.error, result.info
        failure = Failure.of(result.failure).value if error is not None else None
        if error is not None:
            self._count_failure(Failure.of(failure).value, error)
        else:
            self.resets_total += 1
        return SlotReset(result.obs, info, self._slots.env_seeds[slot], error, failure)

    def _count_failure_of(self, result: TurnResult) -> None:
        self.steps_total += 1
        self._count_failure(Failure.of(result.failure).value, result.error or "")

    def _count_failure(self, failure: str, error: str) -> None:
        self.failures[failure] += 1
        self.recent_failures.append({"time": time.time(), "failure": failure, "error": error})


__all__ = ["BranchRequest", "Branched", "PoolFull", "PoolTimeout", "ReleaseRequest",
           "ResetSlotRequest", "SlotEngine", "SlotPool", "SlotRequest", "SlotReset",
           "StepSlotRequest"]
