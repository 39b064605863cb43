"""Dispatch: moves the pool's requests to workers and their replies back, within deadlines.

Each worker has a FIFO queue of `Pending` requests; only its head is on the wire (one
outstanding request per worker), stamped with a fresh sequence number, so a late reply from a
worker the pool gave up on is recognised and dropped. `Dispatcher.pump` waits on the backend
for replies and enforces ``step_timeout`` / ``reset_timeout`` on each head (an env that
started later, as reported by the worker's progress record, gets its own full budget).
Results land in a `Ticket`, one per pool call, in the caller's order.

A dead or stuck worker is replaced (`Dispatcher._recover`): the env it was running fails, its
other envs are brought back from the `ReplayLog` (which holds every env's episode seed and
its turns since), and the unfinished part of the request is sent again. The dispatcher owns
the per-env state of the pool (seeds through its replay log, failed envs, envs in flight);
groups, seed schedules and the public API are ``api.py``'s.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from turnpool.backends.base import Backend
from turnpool.pool.replay import ReplayLog
from turnpool.worker.protocol import (
    BackendUnavailable,
    Op,
    ResetResult,
    TurnResult,
    WorkerLost,
    as_turn_results,
    bounded,
    error_reset,
    error_step,
)

log = logging.getLogger(__name__)

#: Seconds the pool waits past a straggler's own deadline (the worker answers ``timeout``
#: itself when it can) before it replaces the worker.
LATE_GRACE_S = 0.5


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

    def __init__(self, op: Op, env_ids: Sequence[int], items: Any, ticket: Ticket | None,
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


class Straggler:
    """An env of a step request its worker answered in part (`Op.PARTIAL`): its result comes
    later on its own (`Op.LATE`), or the worker is replaced once ``due`` passes."""

    __slots__ = ("head", "k", "due")

    def __init__(self, head: Pending, k: int, due: float) -> None:
        self.head = head
        self.k = k
        self.due = due

    @property
    def env_id(self) -> int:
        return int(self.head.env_ids[self.k])


class Dispatcher:
    """Per-worker request queues, sequence numbers, deadlines, result delivery and recovery
    for the envs ``0 .. num_envs - 1`` of a started ``backend``."""

    def __init__(self, backend: Backend, num_envs: int, step_timeout: float | None,
                 reset_timeout: float | None) -> None:
        self.backend = backend
        self._limits = Op.limits(step_timeout, reset_timeout)
        self.replay = ReplayLog(backend.slices, num_envs)
        self._seq = 0
        #: failed envs (until their next reset) -> why, and their failure class
        self.broken: dict[int, str] = {}
        self.failure: dict[int, str] = {}
        #: env ids of `step_async` turns not polled yet, and the finished ones
        self.in_flight: set[int] = set()
        self.ready: list[tuple[int, TurnResult | ResetResult]] = []
        self.owner = [0] * num_envs
        for w, ids in enumerate(backend.slices):
            for i in ids:
                self.owner[i] = w
        self._queues: list[deque[Pending]] = [deque() for _ in backend.slices]
        #: per worker, env id -> its `Straggler` (envs answered after their request)
        self._late: list[dict[int, Straggler]] = [{} for _ in backend.slices]
        # Fast path for whole-pool calls: worker w's envs are all_ids[a:b].
        self._spans: list[tuple[int, int]] | None = None
        flat = [i for ids in backend.slices for i in ids]
        if flat == list(range(num_envs)):
            pos = 0
            self._spans = []
            for ids in backend.slices:
                self._spans.append((pos, pos + len(ids)))
                pos += len(ids)

    # ------------------------------------------------------------------ calls (api.py)
    def turns(self, ticket: Ticket, action_lists: list[Any], whole: bool = False,
              single: bool = False) -> None:
        """Send one turn per env of ``ticket`` (``whole``: every env, in order)."""
        ids = ticket.env_ids
        broken = self.broken
        op = Op.STEP1 if single else Op.STEP
        failed: list[tuple[int, int]] = []
        if whole and self._spans is not None and not broken:
            # Contiguous slices: the request is a range and a list slice, no per-env work.
            for w, (a, b) in enumerate(self._spans):
                if a < b:
                    span = range(a, b)
                    self.enqueue(w, Pending(op, span, (span, action_lists[a:b]), ticket, span))
        else:
            per_worker: dict[int, tuple[list[int], list[Any], list[int]]] = {}
            owner = self.owner
            for pos, i in enumerate(ids):
                if i in broken:  # a failed env stays failed until reset; no worker needed
                    failed.append((pos, i))
                    continue
                wids, wacts, wpos = per_worker.setdefault(owner[i], ([], [], []))
                wids.append(i)
                wacts.append(action_lists[pos])
                wpos.append(pos)
            for w, (wids, wacts, wpos) in per_worker.items():
                self.enqueue(w, Pending(op, wids, (wids, wacts), ticket, wpos))
        if ticket.is_async:
            self.in_flight.update(ids)
        for pos, i in failed:
            self._deliver(ticket, pos, i,
                          error_step(f"env failed earlier ({broken[i]}); reset it",
                                     failure=self.failure.get(i, "env_error")))

    def forget(self, env_ids: Sequence[int]) -> None:
        """Drop these envs' episodes from the replay log (see `EnvPool.forget`)."""
        by_worker: dict[int, list[int]] = {}
        for i in env_ids:
            by_worker.setdefault(self.owner[i], []).append(i)
        for w, ids in by_worker.items():
            self.replay.forget(w, ids, self.broken)

    def finish(self, ticket: Ticket) -> None:
        """Block until every result of ``ticket`` is in (deadlines hold meanwhile)."""
        self.pump(lambda: ticket.remaining == 0, None)

    def enqueue(self, worker: int, pending: Pending) -> None:
        queue = self._queues[worker]
        queue.append(pending)
        if len(queue) == 1:
            self._send(worker, pending)

    def pump(self, done: Callable[[], bool], timeout: float | None) -> None:
        """Process replies and faults until ``done()`` or ``timeout`` (None: until done or
        nothing is in flight)."""
        end = None if timeout is None else time.monotonic() + timeout
        backend = self.backend
        queues = self._queues
        late = self._late
        while not done():
            active = [w for w in range(len(queues)) if queues[w] or late[w]]
            if not active:
                return
            now = time.monotonic()
            wake = end
            for w in active:
                due = self._head_due(w, now) if queues[w] else None
                if late[w]:
                    late_due = self._late_due(w, now)
                    due = late_due if due is None else min(due, late_due)
                if due is not None and (wake is None or due < wake):
                    wake = due
            waiting = [w for w in active if queues[w] or late[w]]
            if not waiting:
                continue
            wait_s = None if wake is None else max(0.0, wake - now)
            for w in backend.wait(waiting, wait_s):
                self._receive(w)
            if end is not None and time.monotonic() >= end:
                return

    def _head_due(self, worker: int, now: float) -> float | None:
        """When the worker's head request is due (None: no deadline; ``now`` after
        recovering the worker)."""
        queue = self._queues[worker]
        limit = self._limits[queue[0].op]
        if limit is None:
            return None
        due = queue[0].clock + limit
        if due <= now:
            rechecked = self._recheck_deadline(worker, limit, now)
            return now if rechecked is None else rechecked  # recovered: look again now
        return due

    def _late_due(self, worker: int, now: float) -> float:
        """When the worker's first straggler is past the grace; recovers the worker if one
        already is (and nothing has arrived meanwhile)."""
        late = self._late[worker]
        due = min(s.due for s in late.values())
        if due > now:
            return due
        if self.backend.wait([worker], 0.0):
            return now  # it has answered (or died) meanwhile: receive that first
        stuck = {i for i, s in late.items() if s.due <= now}
        limit = self._limits[Op.STEP]
        self._recover(worker, f"{Op.STEP.timeout_text} ({limit:g} s)", "timeout", stuck)
        return now  # recovered: look again now

    # ------------------------------------------------------------------ the wire
    def _send(self, worker: int, pending: Pending) -> None:
        queue = self._queues[worker]
        while True:
            self._seq += 1
            pending.seq = self._seq
            pending.clock = time.monotonic()
            try:
                self.backend.send(worker, (pending.seq, pending.op, pending.items))
                return
            except (OSError, WorkerLost) as exc:  # it died between calls; recover in pump
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
        if not pending.op.is_turn:
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

    def _recheck_deadline(self, worker: int, limit: float, now: float) -> float | None:
        """The head request looks late; an env that started later gets its own full budget."""
        head = self._queues[worker][0]
        if self.backend.wait([worker], 0.0):
            return now  # it has answered (or died) meanwhile: receive that first
        progress = self.backend.progress(worker)
        if progress is not None:
            env_id, since = progress
            if since > head.clock:
                head.clock = since
                if since + limit > now:
                    return since + limit
        if self.backend.worker_dead(worker):  # died, and its death is not reported yet
            self._recover(worker, "worker died", "worker_lost")
            return None
        self._recover(worker, f"{head.op.timeout_text} ({limit:g} s)", "timeout")
        return None

    def _receive(self, worker: int) -> None:
        queue = self._queues[worker]
        try:
            seq, _op, payload, failure, error = self.backend.recv(worker)
        except WorkerLost as exc:
            self._recover(worker, str(exc) or "worker died", "worker_lost")
            return
        if _op is Op.LATE:
            self._late_results(worker, seq, payload)
            return
        if not queue or seq != queue[0].seq:
            log.debug("discarding a stale reply (seq %d) from worker %d", seq, worker)
            return
        head = queue.popleft()
        if failure is not None:  # the request failed as a whole: every env of it did
            for k, i in enumerate(head.env_ids):
                self._fail(head, k, i, f"worker error: {error}", failure)
        elif _op is Op.PARTIAL:
            self._partial(worker, head, payload)
        else:
            self._complete(head, payload)
        if queue:
            self._send(worker, queue[0])

    def _complete(self, head: Pending, payload: Any) -> None:
        ids = head.env_ids
        ticket = head.ticket
        if head.op.is_turn:
            assert ticket is not None
            wire, failed = payload
            results = as_turn_results(wire)
            for k in failed:
                self.broken[ids[k]] = results[k].error
                self.failure[ids[k]] = results[k].failure or "env_error"
            self.replay.stepped(self.owner[ids[0]], head.env_ids, head.items[1],
                                head.op is Op.STEP1)
            positions = head.positions
            if not ticket.is_async and isinstance(positions, range) and positions.step == 1:
                ticket.out[positions.start:positions.stop] = results
                ticket.remaining -= len(results)
            else:
                for i, pos, r in zip(ids, positions, results):
                    self._deliver(ticket, pos, i, r)
        elif head.op is Op.RESET:
            assert ticket is not None and head.seeds is not None
            started: dict[int, int] = {}
            for i, pos, s, r in zip(ids, head.positions, head.seeds, payload):
                if r.error is None:
                    started[i] = s
                    self.broken.pop(i, None)
                else:
                    self.broken[i] = r.error
                    self.failure[i] = r.failure or "env_error"
                    self.replay.seeds[i] = None
                self._deliver(ticket, pos, i, r)
            self.replay.started(self.owner[ids[0]], started, self.broken)
        else:  # Op.RESTORE
            for i, err in zip(ids, payload):
                if err is not None:
                    self.broken[i] = f"restore failed: {err}"
                    self.failure[i] = "worker_lost"

    def _partial(self, worker: int, head: Pending, payload: Any) -> None:
        """The worker answered ``head`` except its stalled envs, which become stragglers."""
        wire, pending = payload
        limit = self._limits[head.op]
        late = self._late[worker]
        waiting = set()
        for k, since in pending:
            due = since + limit + LATE_GRACE_S if limit is not None else float("inf")
            late[int(head.env_ids[k])] = Straggler(head, k, due)
            waiting.add(k)
        ids, actions = head.env_ids, head.items[1]
        done = [k for k in range(len(ids)) if k not in waiting]
        self.replay.stepped(worker, [ids[k] for k in done], [actions[k] for k in done],
                            head.op is Op.STEP1)
        ticket = head.ticket
        assert ticket is not None
        for k in done:
            self._turn_done(ticket, head.positions[k], ids[k], wire[k])

    def _late_results(self, worker: int, seq: int, payload: Any) -> None:
        """Results of stragglers (an `Op.LATE` reply); stale ones are dropped."""
        late = self._late[worker]
        for env_id, wire in payload:
            straggler = late.get(env_id)
            if straggler is None or straggler.head.seq != seq:
                log.debug("discarding a stale late result of env %d", env_id)
                continue
            del late[env_id]
            head = straggler.head
            self.replay.stepped(worker, [env_id], [head.items[1][straggler.k]],
                                head.op is Op.STEP1)
            assert head.ticket is not None
            self._turn_done(head.ticket, head.positions[straggler.k], env_id, wire)

    def _turn_done(self, ticket: Ticket, pos: int, env_id: int, wire: Any) -> None:
        result = as_turn_results([wire])[0]
        if result.error is not None:
            self.broken[env_id] = result.error
            self.failure[env_id] = result.failure or "env_error"
        self._deliver(ticket, pos, env_id, result)

    def _deliver(self, ticket: Ticket, pos: int, env_id: int,
                 result: TurnResult | ResetResult) -> None:
        ticket.out[pos] = result
        ticket.remaining -= 1
        if ticket.is_async:  # stays in flight until polled
            self.ready.append((env_id, result))

    def _fail(self, pending: Pending, k: int, env_id: int, reason: str,
              failure: str = "env_error") -> None:
        """Env ``env_id`` (index ``k`` of ``pending``) failed: flag it and deliver the error
        (``failure``: its class, see `turnpool.worker.protocol.FAILURE_CLASSES`)."""
        self.broken[env_id] = reason
        self.failure[env_id] = failure
        if pending.op is Op.RESTORE or pending.ticket is None:
            return
        if pending.op is Op.RESET:
            self.replay.seeds[env_id] = None
            self._deliver(pending.ticket, pending.positions[k], env_id,
                          error_reset(reason, failure))
        else:
            self._deliver(pending.ticket, pending.positions[k], env_id,
                          error_step(reason, failure=failure))

    # ------------------------------------------------------------------ recovery
    def _recover(self, worker: int, reason: str, failure: str,
                 stuck: set[int] | None = None) -> None:
        """Replace a dead or stuck worker; flag the env to blame, bring back the rest.

        The env to blame is ``stuck`` (stragglers past their deadline) if given, else the one
        running when the worker died or hung, from the backend's progress marker; if that is
        unknown, every env of the request is flagged. The worker's other envs are rebuilt by
        reset + replay of the actions recorded since their reset, then the unfinished part of
        the request and every straggler's turn are sent again (a straggler once only).
        """
        queue = self._queues[worker]
        head = queue.popleft() if queue else None
        late = list(self._late[worker].values())
        self._late[worker] = {}
        progress = self.backend.progress(worker)
        culprit = int(progress[0]) if progress is not None else -1
        log.warning("worker %d of %s backend: %s (env %s); restarting it", worker,
                    self.backend.name, reason,
                    sorted(stuck) if stuck else culprit if culprit >= 0 else "unknown")
        try:
            self.backend.restart(worker)
        except (BackendUnavailable, OSError, WorkerLost) as exc:
            # Without a worker its envs cannot run: fail them all, keep the pool consistent.
            log.error("restarting worker %d failed: %s", worker, exc)
            why = f"{reason}; restart failed: {exc}"
            for s in late:
                self._fail(s.head, s.k, s.env_id, why, failure)
            for pending in [*([head] if head is not None else []), *queue]:
                for k, i in enumerate(pending.env_ids):
                    self._fail(pending, k, i, why, failure)
            queue.clear()
            for i in self.backend.slices[worker]:
                if i not in self.broken:
                    self.broken[i] = f"worker lost: {exc}"
                    self.failure[i] = "worker_lost"
            return
        guilty: list[int] = []
        if stuck is not None:
            guilty_late = stuck  # the head, if any, is innocent: sent again whole
        elif head is not None and culprit in head.env_ids:
            guilty, guilty_late = [culprit], set()
        elif late and failure == "worker_lost":
            # A stalled env's thread may have ended the process: the stragglers are the
            # suspects, the request the worker was on is sent again once.
            guilty_late = {s.env_id for s in late}
        elif (head is not None and progress is not None and failure == "worker_lost"
              and not head.retried and head.op is not Op.RESTORE):
            # It died between envs (killed from outside, e.g. with a sibling worker): no env
            # is to blame; the request is sent again once.
            guilty_late = set()
        else:  # unknown culprit: flag the whole request rather than risk a loop
            guilty = list(head.env_ids) if head is not None else []
            guilty_late = set()
        rest: list[Pending] = []
        if head is not None:
            for i in guilty:
                self._fail(head, head.env_ids.index(i), i, reason, failure)
            if head.op is not Op.RESTORE:
                retry = _without(head, set(guilty))
                if retry is not None:
                    rest.append(retry)
        for s in late:
            if s.env_id in guilty_late or s.head.retried:
                # a straggler already sent again once is not sent a third time: with workers
                # dying often (other envs' faults), a hang would restart its deadline forever
                self._fail(s.head, s.k, s.env_id, reason, failure)
            else:
                rest.append(_only(s))
        waiting = list(queue)
        queue.clear()
        resetting = {i for p in (*rest, *waiting) if p.op is Op.RESET for i in p.env_ids}
        seeds = self.replay.seeds
        wanted = [i for i in self.backend.slices[worker]
                  if seeds[i] is not None and i not in self.broken and i not in resetting]
        restore = self.replay.restore_items(worker, wanted)
        if restore:
            queue.append(Pending(Op.RESTORE, [r[0] for r in restore], restore, None, []))
        queue.extend(rest)
        queue.extend(waiting)
        if queue:
            self._send(worker, queue[0])


def _only(straggler: Straggler) -> Pending:
    """A straggler's turn as a request of its own (marked retried)."""
    head, k = straggler.head, straggler.k
    env_id = straggler.env_id
    retry = Pending(head.op, [env_id], ([env_id], [head.items[1][k]]), head.ticket,
                    [head.positions[k]])
    retry.retried = True
    return retry


def _without(head: Pending, guilty: set[int]) -> Pending | None:
    """``head`` again without the ``guilty`` envs (marked retried); None if none is left."""
    keep = [k for k, i in enumerate(head.env_ids) if i not in guilty]
    if not keep:
        return None
    items: Any
    if head.op is Op.RESET:
        # a group whose leader failed gets a new leader
        items = [(seed, kept) for seed, members in head.items
                 if (kept := [i for i in members if i not in guilty])]
        env_ids = [i for _, members in items for i in members]
    else:
        env_ids = [head.env_ids[k] for k in keep]
        items = (env_ids, [head.items[1][k] for k in keep])
    pos_of = dict(zip(head.env_ids, head.positions))
    seeds = None
    if head.seeds is not None:
        seed_of = dict(zip(head.env_ids, head.seeds))
        seeds = [seed_of[i] for i in env_ids]
    retry = Pending(head.op, env_ids, items, head.ticket, [pos_of[i] for i in env_ids], seeds)
    retry.retried = True
    return retry


def _picklable(obj: Any) -> bool:
    try:
        pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
    except Exception:
        return False
    return True
