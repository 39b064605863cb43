"""Dispatch: moves the pool's requests to workers and their replies back, within deadlines.

Each worker has a FIFO queue of `Pending` requests; only its head is on the wire, stamped with
a fresh sequence number, so a late reply from a worker the pool gave up on is recognised and
dropped. `Dispatcher._pump` waits on the backend for replies and enforces ``step_timeout`` /
``reset_timeout`` on each head (an env that started later, as reported by the worker's
progress record, gets its own full budget). Results land in a `Ticket`, one per pool call,
in the caller's order.

This layer knows nothing of groups, seeds or the public API (``api.py``) and nothing of how a
lost worker's envs are brought back (``replay.py``): it calls `Dispatcher._recover` and the
two hooks `Dispatcher._step_done` / `Dispatcher._reset_done`, which ``replay.py`` implements.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from turnpool.backends.base import Backend
from turnpool.worker.protocol import (
    ResetResult,
    TurnResult,
    WorkerLost,
    as_turn_results,
    bounded,
    error_reset,
    error_step,
    failure_of,
    op_limit,
)

log = logging.getLogger(__name__)


class Ticket:
    """The results of one pool call, filled in as worker replies arrive."""

    __slots__ = ("env_ids", "out", "remaining", "is_async")

    def __init__(self, env_ids: list[int], is_async: bool) -> None:
        self.env_ids = env_ids
        self.out: list[Any] = [None] * len(env_ids)
        self.remaining = len(env_ids)
        self.is_async = is_async


class Pending:
    """One request to one worker: its envs, where their results go, and its clock."""

    __slots__ = ("seq", "op", "env_ids", "items", "ticket", "positions", "seeds", "clock",
                 "retried")

    def __init__(self, op: str, env_ids: Sequence[int], items: Any, ticket: Ticket | None,
                 positions: Sequence[int], seeds: list[int] | None = None) -> None:
        self.seq = 0
        self.op = op
        self.env_ids = env_ids
        self.items = items
        self.ticket = ticket
        self.positions = positions
        self.seeds = seeds
        self.clock = 0.0
        #: sent again after its worker was lost with no env to blame (only once)
        self.retried = False


class Dispatcher:
    """Per-worker request queues, sequence numbers, deadlines and result delivery.

    `attach` binds a started backend; subclasses (``replay.py``, then ``api.py``) add the
    recovery of lost workers and the public API.
    """

    _backend: Backend
    step_timeout: float | None
    reset_timeout: float | None

    def attach(self, backend: Backend, num_envs: int) -> None:
        """Start dispatching to ``backend``, whose workers hold envs ``0 .. num_envs - 1``."""
        self._backend = backend
        self._seq = 0
        #: each env's current episode seed (None before its first reset or after a failure)
        self._seeds: list[int | None] = [None] * num_envs
        #: failed envs (until their next reset) -> why, and their failure class
        self._broken: dict[int, str] = {}
        self._failure: dict[int, str] = {}
        self._in_flight: set[int] = set()
        #: finished async turns, waiting for `poll`
        self._ready: list[tuple[int, TurnResult]] = []
        self._owner = [0] * num_envs
        for w, ids in enumerate(backend.slices):
            for i in ids:
                self._owner[i] = w
        self._queues: list[deque[Pending]] = [deque() for _ in backend.slices]
        # Fast path for whole-pool calls: worker w's envs are all_ids[a:b].
        self._spans: list[tuple[int, int]] | None = None
        flat = [i for ids in backend.slices for i in ids]
        if flat == list(range(num_envs)):
            pos = 0
            self._spans = []
            for ids in backend.slices:
                self._spans.append((pos, pos + len(ids)))
                pos += len(ids)

    # ------------------------------------------------------------------ hooks (replay.py)
    def _recover(self, worker: int, reason: str, failure: str) -> None:
        """Replace a dead or stuck worker and deal with its queue (``failure``: the class of
        what happened, ``"timeout"`` or ``"worker_lost"``)."""
        raise NotImplementedError

    def _step_done(self, worker: int, head: Pending) -> None:
        """A step request of ``worker`` completed."""

    def _reset_done(self, worker: int, started: list[int]) -> None:
        """A reset request of ``worker`` completed; ``started`` began new episodes."""

    # ------------------------------------------------------------------ dispatch
    def _dispatch_turns(self, ticket: Ticket, action_lists: list[Any], whole: bool = False,
                        single: bool = False) -> None:
        ids = ticket.env_ids
        broken = self._broken
        op = "step1" if single else "step"
        failed: list[tuple[int, int]] = []
        if whole and self._spans is not None and not broken:
            # Contiguous slices: the request is a range and a list slice, no per-env work.
            for w, (a, b) in enumerate(self._spans):
                if a < b:
                    span = range(a, b)
                    self._enqueue(w, Pending(op, span, (span, action_lists[a:b]), ticket, span))
        else:
            per_worker: dict[int, tuple[list[int], list[Any], list[int]]] = {}
            owner = self._owner
            for pos, i in enumerate(ids):
                if i in broken:  # a failed env stays failed until reset; no worker needed
                    failed.append((pos, i))
                    continue
                wids, wacts, wpos = per_worker.setdefault(owner[i], ([], [], []))
                wids.append(i)
                wacts.append(action_lists[pos])
                wpos.append(pos)
            for w, (wids, wacts, wpos) in per_worker.items():
                self._enqueue(w, Pending(op, wids, (wids, wacts), ticket, wpos))
        if ticket.is_async:
            self._in_flight.update(ids)
        for pos, i in failed:
            self._deliver(ticket, pos, i,
                          error_step(f"env failed earlier ({broken[i]}); reset it",
                                     failure=self._failure.get(i, "env_error")))

    def _finish(self, ticket: Ticket) -> None:
        self._pump(lambda: ticket.remaining == 0, None)


    # ------------------------------------------------------------------ request queue
    def _enqueue(self, worker: int, pending: Pending) -> None:
        queue = self._queues[worker]
        queue.append(pending)
        if len(queue) == 1:
            self._send(worker, pending)

    def _send(self, worker: int, pending: Pending) -> None:
        queue = self._queues[worker]
        while True:
            self._seq += 1
            pending.seq = self._seq
            pending.clock = time.monotonic()
            try:
                self._backend.send(worker, (pending.seq, pending.op, pending.items))
                return
            except (OSError, WorkerLost) as exc:  # it died between calls; recover in _pump
                log.debug("sending to worker %d failed: %s", worker, exc)
                return
            except Exception as exc:  # e.g. an action that cannot be pickled
                reason = bounded(f"request could not be sent: {type(exc).__name__}: {exc}")
                log.warning("worker %d: %s", worker, reason)
                rest = self._without_unpicklable(pending, reason)
                if rest is not None:  # only the envs whose actions cannot be pickled failed
                    queue[0] = pending = rest
                    continue
                queue.popleft()
                for k, i in enumerate(pending.env_ids):
                    self._fail(pending, k, i, reason, "unpicklable")
                if not queue:
                    return
                pending = queue[0]

    def _without_unpicklable(self, pending: Pending, reason: str) -> Pending | None:
        """Fail the envs of a turn request whose actions cannot be pickled and return the
        request for the others; None if no single action is to blame (fail them all)."""
        if pending.op not in ("step", "step1"):
            return None
        env_ids, actions = pending.items
        bad = [k for k, a in enumerate(actions) if not _picklable(a)]
        if not bad or len(bad) == len(env_ids):
            return None
        for k in bad:
            self._fail(pending, k, env_ids[k], reason, "unpicklable")
        keep = [k for k in range(len(env_ids)) if k not in set(bad)]
        ids = [env_ids[k] for k in keep]
        positions = [pending.positions[k] for k in keep]
        return Pending(pending.op, ids, (ids, [actions[k] for k in keep]), pending.ticket,
                       positions)

    def _pump(self, done: Callable[[], bool], timeout: float | None) -> None:
        """Process replies and faults until ``done()`` or ``timeout`` (None: until done or
        nothing is in flight)."""
        end = None if timeout is None else time.monotonic() + timeout
        backend = self._backend
        queues = self._queues
        while not done():
            active = [w for w in range(len(queues)) if queues[w]]
            if not active:
                return
            now = time.monotonic()
            wake = end
            for w in active:
                limit = self._limit(queues[w][0].op)
                if limit is None:
                    continue
                due = queues[w][0].clock + limit
                if due <= now:
                    rechecked = self._recheck_deadline(w, limit, now)
                    if rechecked is None:
                        continue  # recovered; its queue was rebuilt
                    due = rechecked
                if wake is None or due < wake:
                    wake = due
            if not any(queues):
                continue
            wait_s = None if wake is None else max(0.0, wake - now)
            for w in backend.wait([w for w in active if queues[w]], wait_s):
                self._receive(w)
            if end is not None and time.monotonic() >= end:
                return

    def _limit(self, op: str) -> float | None:
        return op_limit(op, self.step_timeout, self.reset_timeout)

    def _recheck_deadline(self, worker: int, limit: float, now: float) -> float | None:
        """The head request looks late; an env that started later gets its own full budget."""
        head = self._queues[worker][0]
        if self._backend.wait([worker], 0.0):
            return now  # it has answered (or died) meanwhile: receive that first
        progress = self._backend.progress(worker)
        if progress is not None:
            env_id, since = progress
            if since > head.clock:
                head.clock = since
                if since + limit > now:
                    return since + limit
        if self._backend.worker_dead(worker):  # died, and its death is not reported yet
            self._recover(worker, "worker died", "worker_lost")
            return None
        what = "reset timeout" if head.op == "reset" else "step timeout"
        self._recover(worker, f"{what} ({limit:g} s)", "timeout")
        return None

    def _receive(self, worker: int) -> None:
        queue = self._queues[worker]
        try:
            seq, payload, error = self._backend.recv(worker)
        except WorkerLost as exc:
            self._recover(worker, str(exc) or "worker died", "worker_lost")
            return
        if not queue or seq != queue[0].seq:
            log.debug("discarding a stale reply (seq %d) from worker %d", seq, worker)
            return
        head = queue.popleft()
        self._complete(head, payload, error)
        if queue:
            self._send(worker, queue[0])

    def _complete(self, head: Pending, payload: Any, error: str | None) -> None:
        ids = head.env_ids
        ticket = head.ticket
        if error is not None:  # the worker's host failed as a whole
            for k, i in enumerate(ids):
                self._fail(head, k, i, f"worker error: {error}",
                           "timeout" if "timeout" in error else "worker_lost")
            return
        if head.op == "step" or head.op == "step1":
            assert ticket is not None
            wire, failed = payload
            results = as_turn_results(wire)
            for k in failed:
                self._broken[ids[k]] = results[k].error
                self._failure[ids[k]] = failure_of(results[k].info)
            self._step_done(self._owner[ids[0]], head)
            positions = head.positions
            if not ticket.is_async and isinstance(positions, range) and positions.step == 1:
                ticket.out[positions.start:positions.stop] = results
                ticket.remaining -= len(results)
            else:
                for i, pos, r in zip(ids, positions, results):
                    self._deliver(ticket, pos, i, r)
        elif head.op == "reset":
            assert ticket is not None and head.seeds is not None
            started: list[int] = []
            for i, pos, s, r in zip(ids, head.positions, head.seeds, payload):
                if r.error is None:
                    self._seeds[i] = s
                    started.append(i)
                    self._broken.pop(i, None)
                else:
                    self._broken[i] = r.error
                    self._failure[i] = failure_of(r.info)
                    self._seeds[i] = None
                self._deliver(ticket, pos, i, r)
            self._reset_done(self._owner[ids[0]], started)
        else:  # restore
            for i, err in zip(ids, payload):
                if err is not None:
                    self._broken[i] = f"restore failed: {err}"
                    self._failure[i] = "worker_lost"

    def _deliver(self, ticket: Ticket, pos: int, env_id: int,
                 result: TurnResult | ResetResult) -> None:
        ticket.out[pos] = result
        ticket.remaining -= 1
        if ticket.is_async:  # stays in flight until polled (async tickets are turns)
            assert isinstance(result, TurnResult)
            self._ready.append((env_id, result))

    def _fail(self, pending: Pending, k: int, env_id: int, reason: str,
              failure: str = "env_error") -> None:
        """Env ``env_id`` (index ``k`` of ``pending``) failed: flag it and deliver the error
        (``failure``: its class, see `turnpool.worker.protocol.FAILURE_CLASSES`)."""
        self._broken[env_id] = reason
        self._failure[env_id] = failure
        if pending.op == "restore" or pending.ticket is None:
            return
        if pending.op == "reset":
            self._seeds[env_id] = None
            self._deliver(pending.ticket, pending.positions[k], env_id,
                          error_reset(reason, failure))
        else:
            self._deliver(pending.ticket, pending.positions[k], env_id,
                          error_step(reason, failure=failure))


def _picklable(obj: Any) -> bool:
    try:
        pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
    except Exception:
        return False
    return True

