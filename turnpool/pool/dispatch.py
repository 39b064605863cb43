"""Dispatch: moves the pool's requests to workers and their replies back, within deadlines.

Each worker has a FIFO queue of `Pending` requests; only its head is on the wire, stamped with
a fresh sequence number, so a late reply from a worker the pool gave up on is recognised and
dropped. The next request goes out when the head is answered, in full or in part: a worker
that hands a stalled env off (`Op.PARTIAL`) gets its next request while that env's result is
still to come (`Op.LATE`), so a worker may hold several requests' stragglers at once, but
never more than one request that is not answered at all. `Dispatcher.pump` waits on the
backend for replies and enforces ``step_timeout`` / ``reset_timeout`` on each head and each
straggler (an env that started later, as reported by the worker's progress record, gets its
own full budget). Results land in a `Ticket`, one per pool call, in the caller's order.

The dispatcher owns the `EnvTable` (``table``): every env's owner, episode, flight and
failure state, changed only through the table's methods (the pool's API and branching call a
few of them too: `turnpool.pool.table`). How a
reply is filed depends on its kind in the op table (`_FILE`). A dead or stuck worker is
replaced in two steps: the deadline checks (`_head_check`, `_late_check`) only look and
return a `Fault`; `_recover` gets a `Plan` from the pure `turnpool.pool.recovery.decide`
(whom to blame, what to restore and send again) and carries it out. Groups, seed schedules
and the public API are ``api.py``'s; requests are built in ``requests.py``.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from turnpool.backends.base import Backend
from turnpool.pool.recovery import Blame, Fault, abandon, decide
from turnpool.pool.replay import ReplayLog
from turnpool.pool.requests import (
    Pending,
    Straggler,
    Ticket,
    keeping,
    reset_requests,
    restore_request,
    spans_of,
    step_requests,
)
from turnpool.pool.table import EnvTable
from turnpool.worker.errors import BackendUnavailable, WorkerLost, bounded
from turnpool.worker.failures import Failure
from turnpool.worker.protocol import (
    OP_LATE,
    REPLY_KIND,
    LateReply,
    Op,
    PartialReply,
    ReplyKind,
    ResetReply,
    ResetRequest,
    RestoreReply,
    StepReply,
    StepRequest,
    decode,
    encode,
)
from turnpool.worker.results import (
    ResetResult,
    TurnResult,
    as_turn_result,
    as_turn_results,
    error_reset,
    error_step,
)

log = logging.getLogger(__name__)

#: Seconds the pool waits past a straggler's own deadline (the worker answers ``timeout``
#: itself when it can) before it replaces the worker.
LATE_GRACE_S = 0.5

__all__ = ["LATE_GRACE_S", "Dispatcher", "Pending", "Straggler", "Ticket"]


class Dispatcher:
    """Per-worker request queues, sequence numbers, deadlines, result delivery and recovery
    for the envs ``0 .. num_envs - 1`` of a started ``backend``."""

    def __init__(self, backend: Backend, num_envs: int, step_timeout: float | None,
                 reset_timeout: float | None) -> None:
        self.backend = backend
        self._limits = Op.limits(step_timeout, reset_timeout)
        self.table = EnvTable(backend.slices, num_envs)
        self._seq = 0
        self._queues: list[deque[Pending]] = [deque() for _ in backend.slices]
        # Fast path for whole-pool calls: each worker's envs are a span of all ids.
        self._spans = spans_of(backend.slices, num_envs)

    @property
    def replay(self) -> ReplayLog:
        """The env table's replay log (read by tests of the slot engine)."""
        return self.table.replay

    # ------------------------------------------------------------------ calls (api.py)
    def turns(self, ticket: Ticket, action_lists: list[Any], whole: bool = False,
              single: bool = False) -> None:
        """Send one turn per env of ``ticket`` (``whole``: every env, in order)."""
        table = self.table
        failed = table.failed
        spans = self._spans if whole and not failed else None
        requests, skipped = step_requests(ticket, action_lists, single, table.owners, spans,
                                          failed.__contains__ if failed else None)
        for w, pending in requests:
            self.enqueue(w, pending)
        if ticket.is_async:
            table.sent_async(ticket.env_ids)
        for pos, i in skipped:  # a failed env stays failed until reset; no worker needed
            self._deliver(ticket, pos, i,
                          error_step(f"env failed earlier ({failed[i]}); reset it",
                                     failure=table.failure_of(i)))

    def resets(self, ticket: Ticket, base: int | Mapping[int, int], group_ids: Sequence[int]
               ) -> None:
        """Reset the envs of ``ticket``: group ``g`` gets seed ``base + g`` (``base[g]``
        from a mapping)."""
        for w, pending in reset_requests(ticket, base, group_ids, self.table.owners):
            self.enqueue(w, pending)
        if ticket.is_async:
            self.table.sent_async(ticket.env_ids)

    def finish(self, ticket: Ticket) -> None:
        """Block until every result of ``ticket`` is in (deadlines hold meanwhile)."""
        self.pump(lambda: ticket.remaining == 0, None)

    def enqueue(self, worker: int, pending: Pending) -> None:
        queue = self._queues[worker]
        queue.append(pending)
        if len(queue) == 1:
            self._send(worker, pending)

    def wait_fds(self) -> tuple[list[int], bool] | None:
        """What `pump` would wait on, as file descriptors (`Backend.wait_fds`: None when the
        backend has none): the workers with requests or stragglers out; and whether every
        worker has a request out (a new one would queue behind it)."""
        queues, late = self._queues, self.table.stragglers
        fds = self.backend.wait_fds([w for w, queue in enumerate(queues) if queue or late[w]])
        return None if fds is None else (fds, all(queues))

    def pump(self, done: Callable[[], bool], timeout: float | None) -> None:
        """Process replies and faults until ``done()`` or ``timeout`` (None: until done or
        nothing is in flight)."""
        end = None if timeout is None else time.monotonic() + timeout
        backend = self.backend
        queues = self._queues
        late = self.table.stragglers
        while not done():
            active = [w for w in range(len(queues)) if queues[w] or late[w]]
            if not active:
                return
            now = time.monotonic()
            wake = end
            for w in active:
                # `_check`, but a worker with no stragglers (the common case) in one call
                due = self._check(w, now) if late[w] else self._head_check(w, now)
                if isinstance(due, Fault):
                    self._recover(w, due)
                    due = now
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

    def _check(self, worker: int, now: float) -> float | None:
        """When ``worker`` next needs a look (None: no deadline); a worker found lost or
        stuck is recovered here, and the answer is ``now`` (look again)."""
        due: float | None = None
        if self._queues[worker]:
            head_due = self._head_check(worker, now)
            if isinstance(head_due, Fault):
                self._recover(worker, head_due)
                return now
            due = head_due
        if self.table.stragglers[worker]:
            late_due = self._late_check(worker, now)
            if isinstance(late_due, Fault):
                self._recover(worker, late_due)
                return now
            due = late_due if due is None else min(due, late_due)
        return due

    def _head_check(self, worker: int, now: float) -> float | Fault | None:
        """When the worker's head request is due (None: no deadline), or the `Fault` if it
        is past due. An env that started later gets its own full budget (the head's clock
        moves to its start); ``now`` when the worker has answered (or died) meanwhile."""
        head = self._queues[worker][0]
        limit = self._limits[head.op]
        if limit is None:
            return None
        due = head.clock + limit
        if due > now:
            return due
        if self.backend.wait([worker], 0.0):
            return now  # it has answered (or died) meanwhile: receive that first
        progress = self.backend.progress(worker)
        if progress is not None:
            _env_id, since = progress
            if since > head.clock:
                head.clock = since
                if since + limit > now:
                    return since + limit
        if self.backend.worker_dead(worker):  # died, and its death is not reported yet
            return Fault("worker died", Failure.WORKER_LOST)
        return Fault(f"{head.op.timeout_text} ({limit:g} s)", Failure.TIMEOUT)

    def _late_check(self, worker: int, now: float) -> float | Fault:
        """When the worker's first straggler is past the grace, or the `Fault` naming those
        past it (``now`` if the worker has answered or died meanwhile)."""
        late = self.table.stragglers[worker]
        due = min(s.due for s in late.values())
        if due > now:
            return due
        if self.backend.wait([worker], 0.0):
            return now  # it has answered (or died) meanwhile: receive that first
        stuck = frozenset(i for i, s in late.items() if s.due <= now)
        limit = self._limits[Op.STEP]
        return Fault(f"{Op.STEP.timeout_text} ({limit:g} s)", Failure.TIMEOUT, stuck)

    # ------------------------------------------------------------------ the wire
    def _send(self, worker: int, pending: Pending) -> None:
        queue = self._queues[worker]
        while True:
            self._seq += 1
            pending.seq = self._seq
            pending.clock = time.monotonic()
            try:
                self.backend.send(worker, encode(pending.seq, pending.request))
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
                    self._fail(pending, k, i, reason, Failure.UNPICKLABLE)
                if not queue:
                    return
                pending = queue[0]

    def _without_unpicklable(self, pending: Pending, reason: str) -> Pending | None:
        """Fail the envs of a turn request whose actions cannot be pickled and return the
        request for the others; None if no single action is to blame (fail them all)."""
        if not pending.op.is_turn:
            return None
        actions = pending.actions()
        bad = [k for k, a in enumerate(actions) if not _picklable(a)]
        if not bad or len(bad) == len(actions):
            return None
        for k in bad:
            self._fail(pending, k, pending.env_ids[k], reason, Failure.UNPICKLABLE)
        skip = set(bad)
        return keeping(pending, [k for k in range(len(actions)) if k not in skip])

    def _receive(self, worker: int) -> None:
        queue = self._queues[worker]
        try:
            # a `WorkerReply`, unpacked (C-level: no attribute lookup per field)
            seq, op, payload, failure, error = decode(self.backend.recv(worker))
        except WorkerLost as exc:
            self._recover(worker, Fault(str(exc) or "worker died", Failure.WORKER_LOST))
            return
        if op is OP_LATE:
            self._late_results(worker, seq, payload)
            return
        if not queue or seq != queue[0].seq:
            log.debug("discarding a stale reply (seq %d) from worker %d", seq, worker)
            return
        head = queue.popleft()
        if failure is not None:  # the request failed as a whole: every env of it did
            for k, i in enumerate(head.env_ids):
                self._fail(head, k, i, f"worker error: {error}", failure)
        else:
            _FILE[REPLY_KIND[op]](self, worker, head, payload)
        if queue:
            self._send(worker, queue[0])

    # ------------------------------------------------------------------ filing replies
    # One method per `ReplyKind` (`_FILE`): how a reply's payload lands in the env table and
    # the caller's ticket. A new op whose reply is of a known kind adds nothing here.
    def _turns_done(self, worker: int, head: Pending, payload: StepReply) -> None:
        request = head.request
        assert isinstance(request, StepRequest)
        ids = head.env_ids
        ticket = head.ticket
        assert ticket is not None
        table = self.table
        wire, failed = payload
        for k in failed:
            failed_turn = as_turn_result(wire[k])
            table.fail(ids[k], failed_turn.error or "", Failure.of(failed_turn.failure))
        table.stepped(worker, ids, request.actions, request.single)
        positions = head.positions
        if not ticket.is_async and isinstance(positions, range) and positions.step == 1:
            # a synchronous call's contiguous share: the rows stay plain tuples (no object
            # per env, which the collector would have to visit) until the call returns
            # (`EnvPool._run_turns`); `EnvPool.step` only transposes them
            ticket.out[positions.start:positions.stop] = wire
            ticket.remaining -= len(wire)
        else:
            for i, pos, r in zip(ids, positions, as_turn_results(wire)):
                self._deliver(ticket, pos, i, r)

    def _resets_done(self, worker: int, head: Pending, payload: ResetReply) -> None:
        request, ticket, table = head.request, head.ticket, self.table
        assert ticket is not None and isinstance(request, ResetRequest)
        started: dict[int, int] = {}
        for i, pos, s, r in zip(head.env_ids, head.positions, request.seeds, payload):
            if r.error is None:
                started[i] = s
            else:
                table.fail(i, r.error, Failure.of(r.failure), episode_lost=True)
            self._deliver(ticket, pos, i, r)
        table.started(worker, started)

    def _restored(self, worker: int, head: Pending, payload: RestoreReply) -> None:
        for i, err in zip(head.env_ids, payload):
            if err is not None:
                self.table.fail(i, f"restore failed: {err}", Failure.WORKER_LOST)

    def _values(self, worker: int, head: Pending, payload: list[Any]) -> None:
        """Per-env values of a synchronous call (`turnpool.pool.branch` reads them)."""
        ticket = head.ticket
        assert ticket is not None
        for pos, r in zip(head.positions, payload):
            ticket.out[pos] = r
        ticket.remaining -= len(payload)

    def _partial(self, worker: int, head: Pending, payload: PartialReply) -> None:
        """The worker answered ``head`` except its stalled envs, which become stragglers."""
        wire, pending = payload
        limit = self._limits[head.op]
        waiting = set()
        for k, since in pending:
            due = since + limit + LATE_GRACE_S if limit is not None else float("inf")
            env_id = int(head.env_ids[k])
            self.table.straggling(worker, env_id, Straggler(head, k, due))
            waiting.add(k)
        ids, actions = head.env_ids, head.actions()
        done = [k for k in range(len(ids)) if k not in waiting]
        self.table.stepped(worker, [ids[k] for k in done], [actions[k] for k in done],
                           head.op is Op.STEP1)
        ticket = head.ticket
        assert ticket is not None
        for k in done:
            self._turn_done(ticket, head.positions[k], ids[k], wire[k])

    def _late_results(self, worker: int, seq: int, payload: LateReply) -> None:
        """Results of stragglers (an `Op.LATE` reply); stale ones are dropped."""
        for env_id, wire in payload:
            straggler = self.table.straggler_done(worker, env_id, seq)
            if straggler is None:
                log.debug("discarding a stale late result of env %d", env_id)
                continue
            head = straggler.head
            self.table.stepped(worker, [env_id], [head.actions()[straggler.k]],
                               head.op is Op.STEP1)
            assert head.ticket is not None
            self._turn_done(head.ticket, head.positions[straggler.k], env_id, wire)

    def _turn_done(self, ticket: Ticket, pos: int, env_id: int, wire: Any) -> None:
        result = as_turn_results([wire])[0]
        if result.error is not None:
            self.table.fail(env_id, result.error, Failure.of(result.failure))
        self._deliver(ticket, pos, env_id, result)

    def _deliver(self, ticket: Ticket, pos: int, env_id: int,
                 result: TurnResult | ResetResult) -> None:
        ticket.out[pos] = result
        ticket.remaining -= 1
        if ticket.is_async:  # stays in flight until polled
            self.table.finished_async(env_id, result)

    def _fail(self, pending: Pending, k: int, env_id: int, reason: str,
              failure: Failure = Failure.ENV_ERROR) -> None:
        """Env ``env_id`` (index ``k`` of ``pending``) failed: flag it and deliver the error."""
        is_reset = pending.op is Op.RESET
        self.table.fail(env_id, reason, failure, episode_lost=is_reset and
                        pending.ticket is not None)
        if pending.op is Op.RESTORE or pending.ticket is None:
            return
        if is_reset:
            self._deliver(pending.ticket, pending.positions[k], env_id,
                          error_reset(reason, failure))
        else:
            self._deliver(pending.ticket, pending.positions[k], env_id,
                          error_step(reason, failure=failure))

    # ------------------------------------------------------------------ recovery
    def _recover(self, worker: int, fault: Fault) -> None:
        """Replace a dead or stuck worker and carry out `turnpool.pool.recovery.decide`'s
        plan: fail the blamed envs, restore the innocent ones, send the rest again."""
        queue = self._queues[worker]
        head = queue.popleft() if queue else None
        waiting = list(queue)
        queue.clear()
        table = self.table
        late = table.drop_stragglers(worker)
        progress = self.backend.progress(worker)
        culprit = int(progress[0]) if progress is not None else None
        log.warning("worker %d of %s backend: %s (env %s); restarting it", worker,
                    self.backend.name, fault.reason,
                    sorted(fault.stuck) if fault.stuck else
                    culprit if culprit is not None and culprit >= 0 else "unknown")
        try:
            self.backend.restart(worker)
        except (BackendUnavailable, OSError, WorkerLost) as exc:
            # Without a worker its envs cannot run: fail them all, keep the pool consistent.
            log.error("restarting worker %d failed: %s", worker, exc)
            self._blame(abandon(head, late, waiting),
                        f"{fault.reason}; restart failed: {exc}", fault.failure)
            table.worker_gone(worker, f"worker lost: {exc}")
            return
        plan = decide(fault, head, late, waiting, culprit, table.live(worker))
        self._blame(plan.blame, fault.reason, fault.failure)
        if plan.restore:
            queue.append(restore_request(table.restore_items(worker, plan.restore)))
        queue.extend(plan.resend)
        if queue:
            self._send(worker, queue[0])

    def _blame(self, blame: list[Blame], reason: str, failure: Failure) -> None:
        for pending, k, env_id in blame:
            self._fail(pending, k, env_id, reason, failure)


#: reply kind -> how the dispatcher files it (`ReplyKind.LATE` answers no head: `_receive`)
_FILE: dict[ReplyKind, Callable[[Dispatcher, int, Pending, Any], None]] = {
    ReplyKind.TURNS: Dispatcher._turns_done,
    ReplyKind.RESETS: Dispatcher._resets_done,
    ReplyKind.RESTORED: Dispatcher._restored,
    ReplyKind.VALUES: Dispatcher._values,
    ReplyKind.PARTIAL: Dispatcher._partial,
}


def _picklable(obj: Any) -> bool:
    try:
        pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
    except Exception:
        return False
    return True
