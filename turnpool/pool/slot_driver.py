"""The slot engine's driver: the one thread that touches the pool (`SlotDriver`).

It takes *everything* waiting in its inbox, sends all steps as one `EnvPool.step_async` call
(one message per worker, however many users it serves), starts the resets in one
`EnvPool.reset_async` (each slot to its own seed; seedless ones in a second, on the pool's
schedule), runs the branching calls, and collects
finished turns and resets ready-first with `EnvPool.poll`, so one slow env (or a worker busy
restoring its envs) never holds back another slot's result. While calls are in flight it
sleeps until a worker answers or a request comes in (`EnvPool.wait_fds` and the inbox's wake
pipe, in one ``poll(2)``), not on a timer; while every worker has a request out, a request
coming in does not wake it (it would only queue behind that request): it is sent with the
others that came meanwhile when a worker answers, so a busy server sends fewer, larger
batches. On a backend without fds (threads, Ray) it polls the pool every `POLL_INTERVAL`.
Each step's time from send to result updates its slot's cost, which `SlotEngine` places by.
"""

from __future__ import annotations

import logging
import os
import queue
import select
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

import turnpool.pool.cost as cost_model
from turnpool.pool.slot_requests import (
    BranchRequest,
    Deliveries,
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


class SlotDriver:
    """The driver thread of one `SlotEngine`: `put` hands it requests (``None``: stop);
    ``cost`` (per slot, shared with the engine) is updated from each step's time, and
    ``rebalance`` is called every `REBALANCE_EVERY` s. The counters are written by the
    driver and read (racily, for display) by anyone."""

    def __init__(self, slots: SlotPool, cost: list[float],
                 rebalance: Callable[[], None]) -> None:
        self._slots = slots
        self.cost = cost
        self._rebalance = rebalance
        self._sent: dict[int, float] = {}
        self._rebalanced = 0.0
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
        self.driving = True  # False once the driver thread has ended
        self.steps_total = 0
        self.resets_total = 0
        self.batches_total = 0
        self.failures: Counter[str] = Counter()
        self.recent_failures: deque[dict[str, Any]] = deque(maxlen=20)
        self._thread = threading.Thread(target=self._run, name="turnpool-slots", daemon=True)
        self._thread.start()

    def put(self, item: SlotRequest | list[SlotRequest] | None, wake: bool = False) -> None:
        self._inbox.put(item)
        # `_sleeping` is set by the driver before it looks at the inbox a last time
        if self._sleeping and (wake or not self._workers_busy):
            try:
                os.write(self._wake_w, b"\0")
            except (BlockingIOError, OSError):  # full (it will wake) or closed (it stopped)
                pass

    def stop(self, timeout: float) -> None:
        """Stop the thread (the calls still waiting hear that the engine is closed)."""
        self.put(None, wake=True)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("the slot driver did not stop within %.0f s", timeout)
        else:
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _run(self) -> None:
        try:
            self._drive()
        finally:
            self.driving = False

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
            # a step or reset (one slot, most often): no tuple made, as `slots` would
            if isinstance(r, (StepSlotRequest, ResetSlotRequest)):
                if r.slot in in_flight or r.slot in taken:
                    out.append(_refused(r.waiter, r.slot))
                    continue
                taken.add(r.slot)
                if isinstance(r, StepSlotRequest):
                    steps.append(r)
                else:
                    resets.append(r)
            elif not isinstance(r, ReleaseRequest):
                busy = [s for s in r.slots if s in in_flight or s in taken]
                if busy:  # one call at a time per slot; the others are refused alone
                    out.append(_refused(r.waiter, busy[0]))
                    continue
                taken.update(r.slots)
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
            self._rebalance()

    def _steps(self, steps: list[StepSlotRequest], in_flight: dict[int, Waiter]) -> Deliveries:
        """Send every step as one pool call (one message per worker)."""
        slots = [r.slot for r in steps]
        try:
            self._slots.step_async(slots, [r.actions for r in steps])
        except Exception as exc:  # a closed pool: every caller hears it
            return [(r.waiter, None, exc) for r in steps]
        self.batches_total += 1
        in_flight.update(zip(slots, [r.waiter for r in steps]))  # no Python loop per step
        self._sent.update(dict.fromkeys(slots, time.monotonic()))
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


def _refused(waiter: Waiter, slot: int) -> tuple[Waiter, None, BaseException]:
    return (waiter, None, RuntimeError(
        f"env slot {slot} is still running a call; wait for it first"))


__all__ = ["DEADLINE_CHECK", "IDLE_WAIT", "POLL_INTERVAL", "REBALANCE_EVERY", "SlotDriver"]
