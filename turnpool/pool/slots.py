"""Slots: one `EnvPool` of single-env groups leased to many independent users.

A server session, a TRL tool environment and a verl agent-loop coroutine each drive one env,
one call at a time, from their own thread or event loop, while `EnvPool` is not thread-safe
and its calls block. `SlotEngine` puts the pool on one driver thread and lends its envs out
as *slots*:

* ``lease()`` gives a free slot or raises `PoolFull`; ``release(slot)`` gives it back. The
  one rule when full is that exception, whoever asks. Placement is cost-aware: each slot's
  step cost is measured (a moving average of its steps' time from send to result), and a new
  lease goes to the worker whose leased slots cost least in total (by count until anything is
  measured), so a mix of cheap and expensive sessions stays balanced over the workers; within
  a worker, the most recently released slot first (its env is warm).
* Calls go through an inbox. The driver takes *everything* waiting, sends all steps as one
  `EnvPool.step_async` call (one message per worker, however many users it serves), starts
  the resets batched by seed base (one `EnvPool.reset_async` per distinct base), and collects
  finished turns and resets ready-first with `EnvPool.poll`, so one slow env (or a worker
  busy restoring its envs) never holds back another slot's result.
* Two faces over the same calls: blocking (``submit_reset`` / ``submit_step`` return a
  `concurrent.futures.Future`) and asyncio (``await reset(...)`` / ``await step(...)``, whose
  results reach each event loop in one thread-safe callback per round, not one per result).

Seeds: slot ``i`` is group ``i`` of the pool, whose reset seed is ``base + i``; a reset of
slot ``i`` to seed ``s`` uses ``base = s - i``, so the env starts exactly as
``turnpool.make(env).reset(seed=s)``. A seedless reset follows the pool's own schedule and
reports the seed it used. Everything the pool does holds here too: ``step_timeout`` per env
turn, a dead or stuck worker replaced with only its culprit failed, every backend.

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
import queue
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from typing import Any, NamedTuple

from turnpool.envs.registry import EnvTarget
from turnpool.pool.api import EnvPool
from turnpool.worker.protocol import Failure, ResetResult, TurnResult

log = logging.getLogger(__name__)

#: Seconds the driver waits for a worker reply before it looks at its inbox again.
POLL_INTERVAL = 0.001
#: Seconds the driver sleeps on an empty inbox when nothing is in flight.
IDLE_WAIT = 0.05
#: Seconds between two recounts of each worker's load (the leased slots' measured cost).
REBALANCE_EVERY = 0.5
#: Weight of the newest step in a slot's moving-average cost.
COST_WEIGHT = 0.2

#: A future the driver resolves: `concurrent.futures.Future` (blocking face) or
#: `asyncio.Future` (asyncio face).
Waiter = Any
_Request = tuple[str, int, Any, Waiter]
_Deliver = list[tuple[Waiter, Any, BaseException | None]]


class PoolFull(RuntimeError):
    """Every slot is leased (a server answers "busy"; a trainer raises its capacity)."""


class PoolTimeout(RuntimeError):
    """The pool did not answer a call within the caller's timeout (the slot is retired)."""


class SlotReset(NamedTuple):
    """A slot's reset: its first observation and info, the seed it used, or the failure."""

    obs: str
    info: dict[str, Any]
    seed: int | None
    error: str | None
    failure: str | None


class SlotEngine:
    """``capacity`` single-env slots of one env type on one `EnvPool`, driven by one thread.

    ``pool_options`` go to `EnvPool` (``backend``, ``num_workers``, ``step_timeout``, ...).
    Leases and calls are thread-safe; the pool itself is only touched by the driver thread.
    """

    def __init__(self, env_type: EnvTarget, *, capacity: int,
                 env_kwargs: dict[str, Any] | None = None, seed: int = 0,
                 **pool_options: Any) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
        if pool_options.get("on_error", "flag") != "flag":
            raise ValueError("a SlotEngine reports failures in its results: on_error must be "
                             "'flag'")
        self.env_type = env_type
        self.pool = EnvPool(env_type, env_num=capacity, group_n=1, seed=seed,
                            env_kwargs=dict(env_kwargs or {}), **pool_options)
        self._lock = threading.Lock()
        slices = self.pool.backend.slices
        #: slot -> its worker; per worker its free slots (most recently released first)
        self._worker = [0] * self.pool.num_envs
        for w, ids in enumerate(slices):
            for i in ids:
                self._worker[i] = w
        self._free: list[deque[int]] = [deque(ids) for ids in slices]
        self._leased: set[int] = set()
        #: per slot, its moving-average step cost in seconds (0: not measured yet)
        self.cost: list[float] = [0.0] * self.pool.num_envs
        #: per worker, the cost of its leased slots (unmeasured ones count the mean)
        self.load: list[float] = [0.0] * len(slices)
        self._mean_cost = 1.0
        self._sent: dict[int, float] = {}
        self._rebalanced = 0.0
        #: slots whose call outlived its caller's timeout (never leased again)
        self.lost_slots: set[int] = set()
        self._inbox: queue.SimpleQueue[_Request | list[_Request] | None] = queue.SimpleQueue()
        self._closed = False
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
        return self.pool.num_envs

    @property
    def leased(self) -> int:
        """How many slots are leased now."""
        return len(self._leased)

    def lease(self) -> int:
        """A free slot; `PoolFull` when every slot is leased."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the slot engine is closed")
            free = self._free
            load = self.load
            best = -1
            for w in range(len(free)):
                if free[w] and (best < 0 or load[w] < load[best]):
                    best = w
            if best < 0:
                raise PoolFull(f"all {self.capacity} env slots are leased")
            slot = free[best].popleft()
            self._leased.add(slot)
            load[best] += self.cost[slot] or self._mean_cost
            return slot

    def release(self, slot: int) -> None:
        """Give a slot back (idempotent); it is its worker's next one leased."""
        with self._lock:
            if slot in self._leased:
                self._leased.discard(slot)
                w = self._worker[slot]
                self.load[w] = max(0.0, self.load[w] - (self.cost[slot] or self._mean_cost))
                if slot not in self.lost_slots:
                    self._free[w].appendleft(slot)
                if not self._closed:  # its episode is over for the pool too
                    self._inbox.put(("forget", slot, None, None))

    def rebalance(self) -> None:
        """Recount each worker's load from the leased slots' measured costs (the driver does
        this every `REBALANCE_EVERY` s; leases and releases adjust it in between)."""
        with self._lock:
            cost = self.cost
            known = [cost[s] for s in self._leased if cost[s] > 0.0]
            if known:
                self._mean_cost = sum(known) / len(known)
            load = [0.0] * len(self.load)
            mean = self._mean_cost
            worker = self._worker
            for s in self._leased:
                load[worker[s]] += cost[s] or mean
            self.load = load

    def measured_load(self) -> tuple[float, int, int]:
        """(summed cost of the leased slots measured so far, how many those are, how many
        slots are leased): a load that other engines can compare, unlike `load`, where
        unmeasured slots count this engine's own mean."""
        with self._lock:
            known = [c for c in map(self.cost.__getitem__, self._leased) if c > 0.0]
            return float(sum(known)), len(known), len(self._leased)

    # ------------------------------------------------------------------ blocking face
    def submit_reset(self, slot: int, seed: int | None = None
                     ) -> concurrent.futures.Future[SlotReset]:
        """Start an episode in ``slot`` (from ``seed``, or the pool's schedule)."""
        fut: concurrent.futures.Future[SlotReset] = concurrent.futures.Future()
        self._submit("reset", slot, None if seed is None else int(seed), fut)
        return fut

    def submit_step(self, slot: int, actions: Sequence[Any]
                    ) -> concurrent.futures.Future[TurnResult]:
        """Run ``actions`` in ``slot``, stopping at the first done (cut at ``step_timeout``)."""
        fut: concurrent.futures.Future[TurnResult] = concurrent.futures.Future()
        self._submit("step", slot, list(actions), fut)
        return fut

    # ------------------------------------------------------------------ asyncio face
    async def reset(self, slot: int, seed: int | None = None,
                    timeout: float | None = None) -> SlotReset:
        out: SlotReset = await self._call("reset", slot, None if seed is None else int(seed),
                                          timeout)
        return out

    async def step(self, slot: int, actions: Sequence[Any],
                   timeout: float | None = None) -> TurnResult:
        out: TurnResult = await self._call("step", slot, list(actions), timeout)
        return out

    def step_future(self, slot: int, actions: list[Any], batch: list[Any] | None = None
                    ) -> asyncio.Future[TurnResult]:
        """Submit a step from a running event loop; its result comes as an `asyncio.Future`
        of that loop, with no timeout: a caller that stops waiting calls `abandon`. With
        ``batch``, the request is only appended there, for one `submit_batch` of many."""
        fut: asyncio.Future[TurnResult] = asyncio.get_running_loop().create_future()
        if batch is None:
            self._submit("step", slot, actions, fut)
        else:
            self._check(slot)
            batch.append(("step", slot, actions, fut))
        return fut

    def submit_batch(self, batch: list[Any]) -> None:
        """Hand the driver every request of ``batch`` (built by `step_future`) at once."""
        self._inbox.put(batch)

    def abandon(self, slot: int) -> None:
        """A call of ``slot`` outlived its caller's wait: the slot is never leased again
        (its env may still be running)."""
        with self._lock:
            self.lost_slots.add(slot)

    async def _call(self, op: str, slot: int, arg: Any, timeout: float | None) -> Any:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._submit(op, slot, arg, fut)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except asyncio.TimeoutError:
            self.abandon(slot)  # the env may still be in flight
            raise PoolTimeout(f"the pool did not answer within {timeout:g} s") from None

    def _check(self, slot: int) -> None:
        if self._closed or not self._thread.is_alive():
            raise RuntimeError("the slot engine is closed")
        if slot not in self._leased:
            raise ValueError(f"env slot {slot} is not leased")

    def _submit(self, op: str, slot: int, arg: Any, waiter: Waiter) -> None:
        self._check(slot)
        self._inbox.put((op, slot, arg, waiter))

    def close(self, timeout: float = 30.0) -> None:
        """Stop the driver and the pool (every worker). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._inbox.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("the slot driver did not stop within %.0f s", timeout)
        self.pool.close()

    def __enter__(self) -> SlotEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the driver
    def _run(self) -> None:
        in_flight: dict[int, Waiter] = {}
        while True:
            items = self._drain(block=not in_flight)
            if items is None:
                break
            try:
                self._round(items, in_flight)
            except Exception as exc:  # a bug here must not leave callers waiting forever
                log.exception("the slot driver failed")
                failed = [w for *_, w in items] + list(in_flight.values())
                in_flight.clear()
                _deliver([(w, None, exc) for w in failed])
        closing = RuntimeError("the slot engine is closed")
        _deliver([(w, None, closing) for w in in_flight.values()])
        while True:  # calls that arrived after close
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, list):
                _deliver([(r[3], None, closing) for r in item])
            elif item is not None:
                _deliver([(item[3], None, closing)])

    def _drain(self, block: bool) -> list[_Request] | None:
        """Every request waiting in the inbox (None: stop)."""
        items: list[_Request] = []
        try:
            first = self._inbox.get(timeout=IDLE_WAIT) if block else self._inbox.get_nowait()
        except queue.Empty:
            return items
        while True:
            if first is None:
                return None
            if isinstance(first, list):  # a `submit_batch`
                items.extend(first)
            else:
                items.append(first)
            try:
                first = self._inbox.get_nowait()
            except queue.Empty:
                return items

    def _round(self, items: list[_Request], in_flight: dict[int, Waiter]) -> None:
        """Send the new steps as one pool call, run the resets, collect finished turns."""
        out: _Deliver = []
        steps: list[tuple[int, Any, Waiter]] = []
        resets: list[tuple[int, Any, Waiter]] = []
        busy = set(in_flight)
        forget = [slot for op, slot, _, _ in items if op == "forget"]
        if forget:  # released slots: before this round's resets, which may start them again
            items = [item for item in items if item[0] != "forget"]
            self.pool.forget(forget)
        for op, slot, arg, waiter in items:
            if slot in busy:  # one call at a time per slot; the others are refused alone
                out.append((waiter, None, RuntimeError(
                    f"env slot {slot} is still running a call; wait for it first")))
                continue
            busy.add(slot)
            (steps if op == "step" else resets).append((slot, arg, waiter))
        if steps:
            try:
                self.pool.step_async([s for s, _, _ in steps], [a for _, a, _ in steps])
                self.batches_total += 1
                in_flight.update((s, w) for s, _, w in steps)
                now = time.monotonic()
                self._sent.update((s, now) for s, _, _ in steps)
            except Exception as exc:  # a closed pool: every caller hears it
                out.extend((w, None, exc) for _, _, w in steps)
        if resets:
            out.extend(self._resets(resets, in_flight))
        if in_flight:
            ready = self.pool.poll(timeout=POLL_INTERVAL, min_ready=1)
            now = time.monotonic()
            cost, sent = self.cost, self._sent
            for slot, result in ready:
                waiter = in_flight.pop(slot, None)
                if waiter is None:
                    continue
                if isinstance(result, ResetResult):
                    out.append((waiter, self._reset_done(slot, result), None))
                    continue
                self._count_step(result)
                out.append((waiter, result, None))
                took = now - sent.pop(slot, now)
                cost[slot] = took if not cost[slot] else (
                    cost[slot] + COST_WEIGHT * (took - cost[slot]))
        if out:
            _deliver(out)
        now = time.monotonic()
        if now - self._rebalanced >= REBALANCE_EVERY:
            self._rebalanced = now
            self.rebalance()

    def _resets(self, resets: list[tuple[int, Any, Waiter]], in_flight: dict[int, Waiter]
                ) -> _Deliver:
        """Start one pool reset per distinct seed base (seedless resets share one call, a
        seeded reset of slot ``i`` to seed ``s`` uses base ``s - i``) without waiting: their
        results come ready-first with the turns', so a reset queued behind a slow worker
        holds back no other slot."""
        by_base: dict[int | None, list[tuple[int, Waiter]]] = {}
        for slot, seed, waiter in resets:
            by_base.setdefault(None if seed is None else seed - slot, []).append((slot, waiter))
        out: _Deliver = []
        for base, members in by_base.items():
            try:
                self.pool.reset_async(seed=base, env_ids=[s for s, _ in members])
            except Exception as exc:
                out.extend((w, None, exc) for _, w in members)
                continue
            in_flight.update(members)
        return out

    def _reset_done(self, slot: int, result: ResetResult) -> SlotReset:
        error, info = result.error, result.info
        failure = Failure.of(result.failure).value if error is not None else None
        if error is not None:
            self._count_failure(Failure.of(failure).value, error)
        else:
            self.resets_total += 1
        return SlotReset(result.obs, info, self.pool.env_seeds[slot], error, failure)

    def _count_step(self, result: TurnResult) -> None:
        if result.error is None:
            self.steps_total += result.n_executed
        else:
            self.steps_total += 1
            self._count_failure(Failure.of(result.failure).value, result.error)

    def _count_failure(self, failure: str, error: str) -> None:
        self.failures[failure] += 1
        self.recent_failures.append({"time": time.time(), "failure": failure, "error": error})


def _deliver(out: _Deliver) -> None:
    """Resolve the waiters: concurrent futures directly, asyncio futures in one thread-safe
    callback per event loop."""
    by_loop: dict[asyncio.AbstractEventLoop, _Deliver] = {}
    for item in out:
        waiter = item[0]
        if isinstance(waiter, asyncio.Future):
            by_loop.setdefault(waiter.get_loop(), []).append(item)
        else:
            _resolve([item])
    for loop, items in by_loop.items():
        if loop.is_closed():
            continue
        try:
            loop.call_soon_threadsafe(_resolve, items)
        except RuntimeError:  # the loop closed meanwhile
            pass


def _resolve(out: _Deliver) -> None:
    for waiter, value, exc in out:
        if waiter.done():  # the caller went away (cancelled) while its call ran
            continue
        try:
            if exc is not None:
                waiter.set_exception(exc)
            else:
                waiter.set_result(value)
        except (concurrent.futures.InvalidStateError, asyncio.InvalidStateError):
            pass  # cancelled by its caller in another thread just now


__all__ = ["PoolFull", "PoolTimeout", "SlotEngine", "SlotReset"]
