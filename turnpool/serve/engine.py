"""The pool side of ``turnpool serve``: one `EnvPool` driven from one thread, with env slots
leased to sessions and the steps of many sessions batched into one pool call.

`EnvPool` is not thread-safe and its calls block, while the web server runs on an asyncio
loop. So the pool lives on its own thread (`PoolEngine`), and sessions talk to it through an
inbox: a session's ``await engine.step(slot, actions)`` puts one request in the inbox and
waits on a future. The pool thread takes *every* request waiting in the inbox, sends all the
steps with one `EnvPool.step_async` call (one message per worker per batch, however many
sessions it holds), and collects finished turns with `EnvPool.poll`; results go back to the
loop in one thread-safe callback per batch. Everything the pool already does for a rollout
holds here too: ``step_timeout`` is enforced per env turn, a dead or stuck worker is
replaced and only its culprit env fails (the others are rebuilt by reset + replay), and every
backend (Ray included) works unchanged.

Seeds: the pool gives env ``i`` (one env per group) the seed ``base + i``; a session that
asks for seed ``s`` on slot ``i`` gets a reset with ``base = s - i``, so its env starts from
exactly ``turnpool.make(env).reset(seed=s)``. A seedless reset takes the pool's own seed
schedule and reports the seed it used (`EnvPool.env_seeds`).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from turnpool.pool import EnvPool
from turnpool.worker.protocol import FAILURE_CLASSES, TurnResult
from turnpool.worker.protocol import failure_of as protocol_failure_of

log = logging.getLogger(__name__)

#: Seconds the pool thread waits for a worker reply before it looks at its inbox again.
POLL_INTERVAL = 0.001
#: Seconds the pool thread sleeps on an empty inbox when nothing is in flight.
IDLE_WAIT = 0.05


@dataclass
class ServeSettings:
    """What a ``turnpool serve`` runs. Every field is also a CLI option / config key."""

    env: str = "sokoban"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    backend: str = "process"
    num_workers: int | None = None
    #: env slots in the pool = the most sessions held at once (more get a "busy" answer)
    max_sessions: int = 256
    #: seconds one env may spend on one turn before its worker is killed and the env flagged
    step_timeout: float = 30.0
    reset_timeout: float | None = None
    #: seconds a session may stay idle before the server closes it and frees its slot
    session_timeout: float = 300.0
    #: the pool's base seed, used for seedless resets
    seed: int = 0
    #: seconds a session waits for the pool at most (None: 10 x step_timeout + 60); the pool
    #: answers within its own deadlines, so this only bounds a pool that stopped answering
    call_timeout: float | None = None
    #: bounds on what a client may send in one step
    max_action_chars: int = 16_384
    max_actions_per_step: int = 64
    backend_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepOutcome:
    """One session's turn: the pool's `TurnResult` plus the failure class when it failed."""

    result: TurnResult
    failure: str | None
    retryable: bool


@dataclass
class ResetOutcome:
    obs: str
    info: dict[str, Any]
    seed: int | None
    error: str | None
    failure: str | None
    retryable: bool


class PoolTimeout(RuntimeError):
    """The pool did not answer a session within ``call_timeout``."""


def failure_of(info: dict[str, Any]) -> tuple[str, bool]:
    """The failure class and retryability a failed result reports."""
    failure = protocol_failure_of(info)
    return failure, FAILURE_CLASSES[failure]


_Deliver = list[tuple["asyncio.Future[Any]", Any, BaseException | None]]


class PoolEngine:
    """An `EnvPool` of ``max_sessions`` single-env groups on its own thread, with slot leases.

    `lease` / `release` and the ``async`` calls must be used from one asyncio loop (the web
    server's); the pool itself is only ever touched by the engine's thread.
    """

    def __init__(self, settings: ServeSettings) -> None:
        self.settings = settings
        self.pool = EnvPool(settings.env, env_num=settings.max_sessions, group_n=1,
                            seed=settings.seed, env_kwargs=dict(settings.env_kwargs),
                            backend=settings.backend, num_workers=settings.num_workers,
                            step_timeout=settings.step_timeout,
                            reset_timeout=settings.reset_timeout, on_error="flag",
                            **settings.backend_options)
        self._free: deque[int] = deque(range(self.pool.num_envs))
        #: slots whose call outlived ``call_timeout`` (kept out of the free list)
        self.lost_slots: set[int] = set()
        self._inbox: queue.SimpleQueue[tuple[str, int, Any, asyncio.Future[Any]] | None] = (
            queue.SimpleQueue())
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        # counters, written by the pool thread, read (racily, for display) by the loop
        self.steps_total = 0
        self.resets_total = 0
        self.batches_total = 0
        self.failures: Counter[str] = Counter()
        self.recent_failures: deque[dict[str, Any]] = deque(maxlen=20)
        self._thread = threading.Thread(target=self._run, name="turnpool-serve-pool",
                                        daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ leases (loop side)
    @property
    def capacity(self) -> int:
        return self.pool.num_envs

    @property
    def in_use(self) -> int:
        return self.capacity - len(self._free)

    def lease(self) -> int | None:
        """A free env slot, or None when every slot is held (the caller answers "busy")."""
        return self._free.popleft() if self._free else None

    def release(self, slot: int) -> None:
        """Give a slot back; it is the next one leased (the most recently used env first)."""
        if slot not in self.lost_slots:
            self._free.appendleft(slot)

    # ------------------------------------------------------------------ calls (loop side)
    async def reset(self, slot: int, seed: int | None) -> ResetOutcome:
        out: ResetOutcome = await self._call("reset", slot, seed)
        return out

    async def step(self, slot: int, actions: Sequence[Any]) -> StepOutcome:
        out: StepOutcome = await self._call("step", slot, list(actions))
        return out

    @property
    def call_timeout(self) -> float:
        given = self.settings.call_timeout
        if given is not None:
            return given
        return 10 * max(self.settings.step_timeout or 0.0,
                        self.settings.reset_timeout or 0.0) + 60.0

    async def _call(self, op: str, slot: int, arg: Any) -> Any:
        if self._closed or not self._thread.is_alive():
            raise RuntimeError("the server is shutting down")
        loop = asyncio.get_running_loop()
        self._loop = loop
        fut: asyncio.Future[Any] = loop.create_future()
        self._inbox.put((op, slot, arg, fut))
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self.call_timeout)
        except asyncio.TimeoutError:
            # The env may still be in flight: its slot is never leased again.
            self.lost_slots.add(slot)
            raise PoolTimeout(f"the pool did not answer within {self.call_timeout:g} s") \
                from None

    def close(self, timeout: float = 30.0) -> None:
        """Stop the pool thread and the pool (every worker). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._inbox.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("the pool thread did not stop within %.0f s", timeout)
        self.pool.close()

    # ------------------------------------------------------------------ the pool thread
    def _run(self) -> None:
        in_flight: dict[int, asyncio.Future[Any]] = {}
        while True:
            items = self._drain(block=not in_flight)
            if items is None:
                break
            try:
                self._turn(items, in_flight)
            except Exception as exc:  # a bug here must not leave sessions waiting forever
                log.exception("turnpool serve: the pool loop failed")
                failed = [f for *_, f in items] + list(in_flight.values())
                in_flight.clear()
                self._deliver([(f, None, exc) for f in failed])
        for fut in in_flight.values():
            self._deliver([(fut, None, RuntimeError("the server is shutting down"))])

    def _turn(self, items: list[tuple[str, int, Any, asyncio.Future[Any]]],
              in_flight: dict[int, asyncio.Future[Any]]) -> None:
        """One round: send the new steps as one pool call, run the resets, collect results."""
        out: _Deliver = []
        steps = [(slot, arg, fut) for op, slot, arg, fut in items if op == "step"]
        resets = [(slot, arg, fut) for op, slot, arg, fut in items if op == "reset"]
        if steps:
            try:
                self.pool.step_async([s for s, _, _ in steps], [a for _, a, _ in steps])
                self.batches_total += 1
                in_flight.update((s, f) for s, _, f in steps)
            except Exception as exc:  # a closed pool: every caller hears it
                out.extend((f, None, exc) for _, _, f in steps)
        if resets:
            out.extend(self._resets(resets))
        if in_flight:
            for slot, result in self.pool.poll(timeout=POLL_INTERVAL, min_ready=1):
                fut = in_flight.pop(slot, None)
                if fut is not None:
                    out.append((fut, self._outcome(result), None))
        if out:
            self._deliver(out)

    def _drain(self, block: bool) -> list[tuple[str, int, Any, asyncio.Future[Any]]] | None:
        """Every request waiting in the inbox (None: stop)."""
        items: list[tuple[str, int, Any, asyncio.Future[Any]]] = []
        try:
            first = self._inbox.get(timeout=IDLE_WAIT) if block else self._inbox.get_nowait()
        except queue.Empty:
            return items
        while True:
            if first is None:
                return None
            items.append(first)
            try:
                first = self._inbox.get_nowait()
            except queue.Empty:
                return items

    def _outcome(self, result: TurnResult) -> StepOutcome:
        self.steps_total += result.n_executed if result.error is None else 1
        if result.error is None:
            return StepOutcome(result, None, False)
        failure, retryable = failure_of(result.info)
        self._count_failure(failure, result.error)
        return StepOutcome(result, failure, retryable)

    def _count_failure(self, failure: str, error: str) -> None:
        self.failures[failure] += 1
        self.recent_failures.append({"time": time.time(), "failure": failure, "error": error})

    def _resets(self, resets: list[tuple[int, Any, asyncio.Future[Any]]]) -> _Deliver:
        """One pool reset per distinct seed base: seedless resets share one call, a seeded
        reset of slot ``i`` to seed ``s`` uses base ``s - i``."""
        by_base: dict[int | None, list[tuple[int, asyncio.Future[Any]]]] = {}
        for slot, seed, fut in resets:
            by_base.setdefault(None if seed is None else int(seed) - slot, []).append(
                (slot, fut))
        out: _Deliver = []
        for base, members in by_base.items():
            ids = [slot for slot, _ in members]
            try:
                obs, infos = self.pool.reset(seed=base, env_ids=ids)
            except Exception as exc:
                out.extend((f, None, exc) for _, f in members)
                continue
            seeds = self.pool.env_seeds
            for (slot, fut), o, info in zip(members, obs, infos):
                error = info.get("error") if isinstance(info.get("error"), str) else None
                failure, retryable = (failure_of(info) if error else (None, False))
                if error:
                    self._count_failure(failure or "env_error", error)
                else:
                    self.resets_total += 1
                out.append((fut, ResetOutcome(o, info, seeds[slot], error, failure,
                                              retryable), None))
        return out

    def _deliver(self, out: _Deliver) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(_resolve, out)
        except RuntimeError:  # the loop closed meanwhile
            pass


def _resolve(out: _Deliver) -> None:
    for fut, value, exc in out:
        if fut.done():  # the session went away (cancelled) while its turn ran
            continue
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(value)

