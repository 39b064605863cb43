"""Recovery, decided: whom to blame and what to send again when a worker is lost.

When a worker dies or is found stuck (a `Fault`), the `Dispatcher` asks `decide` for a `Plan`
and then carries it out: it fails the blamed envs, restarts the worker, and queues, in this
order, the restore of the worker's innocent envs (reset + replay, so they are as they were),
the unfinished part of the request the worker was on, each innocent straggler's turn alone,
and the requests that were waiting behind. The order matters: a retried turn must run on a
restored env, and a reset that was waiting must not be undone by a restore (an env being
reset is not restored). `decide` is pure: it reads its arguments and changes nothing, so each
case is tested alone (``tests/pool/test_recovery.py``).

Whom to blame, first rule that applies:

1. stragglers past their deadline (``Fault.stuck``): those; the request the worker was on is
   innocent and sent again whole;
2. the env the worker's progress marker names, if it is in that request: that env;
3. a worker lost while it had stragglers: the stragglers (a stalled env's thread may have
   ended the process); the request is sent again;
4. a worker lost between two envs of a request sent for the first time (killed from outside,
   e.g. with a sibling): nobody; the request is sent again, once;
5. otherwise nobody can be told apart: every env of the request, rather than risk a loop.

A straggler already sent again once fails instead of being sent a third time: with workers
dying often for other envs' faults, a hang would otherwise restart its deadline forever. A
restore is never sent again: its envs fail (their episode is lost with the worker).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from turnpool.pool.requests import Pending, Straggler, alone, without
from turnpool.worker.failures import Failure
from turnpool.worker.protocol import Op

#: an env to fail: the request it was in, its index there, its id
Blame = tuple[Pending, int, int]


@dataclass(frozen=True)
class Fault:
    """Why a worker is to be replaced: the reason every blamed env carries, its class, and
    the stragglers past their deadline when that is the cause."""

    reason: str
    failure: Failure
    stuck: frozenset[int] | None = None


@dataclass
class Plan:
    """What recovery does, in order: fail ``blame``; restore ``restore`` (env ids); then send
    ``resend`` (retries first, then the requests that were waiting)."""

    blame: list[Blame] = field(default_factory=list)
    restore: list[int] = field(default_factory=list)
    resend: list[Pending] = field(default_factory=list)
    #: the env named by the worker's progress marker (None: unknown), for the log
    culprit: int | None = None


def decide(fault: Fault, head: Pending | None, stragglers: Sequence[Straggler],
           waiting: Sequence[Pending], culprit: int | None, live: Sequence[int]) -> Plan:
    """The plan for a lost worker that was on ``head`` with ``stragglers`` out and
    ``waiting`` queued behind; ``culprit`` is the env its progress marker names (None when
    it marked none), ``live`` its envs in an episode and not failed (slice order)."""
    guilty: list[int] = []
    guilty_late: frozenset[int] | set[int] = set()
    lost = fault.failure is Failure.WORKER_LOST
    if fault.stuck is not None:
        guilty_late = fault.stuck
    elif head is not None and culprit is not None and culprit in head.env_ids:
        guilty = [culprit]
    elif stragglers and lost:
        guilty_late = {s.env_id for s in stragglers}
    elif (head is not None and culprit is not None and lost and not head.retried
          and head.op is not Op.RESTORE):
        pass  # died between envs: nobody to blame, sent again once
    elif head is not None:
        guilty = list(head.env_ids)
    plan = Plan(culprit=culprit)
    if head is not None:
        index = {i: k for k, i in enumerate(head.env_ids)} if guilty else {}
        plan.blame.extend((head, index[i], i) for i in guilty)
        retry = without(head, set(guilty))  # None for a restore or nobody left
        if retry is not None:
            plan.resend.append(retry)
    for s in stragglers:
        if s.env_id in guilty_late or s.head.retried:
            plan.blame.append((s.head, s.k, s.env_id))
        else:
            plan.resend.append(alone(s))
    resetting = {i for p in (*plan.resend, *waiting) if p.op is Op.RESET for i in p.env_ids}
    blamed = {i for _, _, i in plan.blame}
    plan.restore = [i for i in live if i not in blamed and i not in resetting]
    plan.resend.extend(waiting)
    return plan


def abandon(head: Pending | None, stragglers: Sequence[Straggler],
            waiting: Sequence[Pending]) -> list[Blame]:
    """Every env to fail when the worker cannot be replaced: stragglers, then the request it
    was on, then the waiting ones."""
    out: list[Blame] = [(s.head, s.k, s.env_id) for s in stragglers]
    for pending in [*([head] if head is not None else []), *waiting]:
        out.extend((pending, k, i) for k, i in enumerate(pending.env_ids))
    return out
