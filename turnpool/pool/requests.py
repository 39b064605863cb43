"""Per-worker requests: how a pool call becomes one typed request per worker, and back.

A pool call (a reset, a turn of some envs) is a `Ticket` that collects its results in the
caller's order. `split` and `step_requests` / `reset_requests` are the one place where a
call's env ids are cut into one `Pending` per worker (the worker that owns each env, from the
`turnpool.pool.table.EnvTable`); `without` and `alone` are the re-sends recovery makes of
them, `keeping` the part of a turn left when some of its actions cannot be pickled.
Nothing here talks to a backend or changes the env table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from turnpool.worker.protocol import (
    STEP_OPS,
    Op,
    RequestRecord,
    ResetRequest,
    RestoreRequest,
    StepRequest,
    step_request,
)


class Ticket:
    """The results of one pool call, filled in as worker replies arrive."""

    __slots__ = ("env_ids", "out", "remaining", "is_async")

    def __init__(self, env_ids: list[int], is_async: bool) -> None:
        self.env_ids = env_ids
        self.out: list[Any] = [None] * len(env_ids)
        self.remaining = len(env_ids)
        self.is_async = is_async


class Pending:
    """One request to one worker: the typed request, where its envs' results go (positions
    in ``ticket``; a restore has no ticket) and its clock once sent."""

    __slots__ = ("seq", "request", "op", "env_ids", "ticket", "positions", "clock", "retried")

    def __init__(self, request: RequestRecord, ticket: Ticket | None,
                 positions: Sequence[int], op: Op | None = None) -> None:
        self.seq = 0
        self.request = request
        #: ``request.op`` (a caller that knows it passes it: the hot path saves the lookup)
        self.op: Op = request.op if op is None else op
        self.env_ids: Sequence[int] = request.env_ids
        self.ticket = ticket
        self.positions = positions
        self.clock = 0.0
        #: sent again after its worker was lost (a request or straggler is resent only once)
        self.retried = False

    def actions(self) -> Sequence[Any]:
        """The actions of a step request, aligned to ``env_ids``."""
        request = self.request
        assert isinstance(request, StepRequest)
        return request.actions


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


def split(env_ids: Sequence[int], owner: Sequence[int], skip: Callable[[int], bool] | None
          = None) -> tuple[dict[int, tuple[list[int], list[int]]], list[tuple[int, int]]]:
    """Per worker (in order of first appearance), its envs of ``env_ids`` and their positions
    in the call; and ``(position, env_id)`` of the envs ``skip`` leaves out."""
    per_worker: dict[int, tuple[list[int], list[int]]] = {}
    skipped: list[tuple[int, int]] = []
    for pos, i in enumerate(env_ids):
        if skip is not None and skip(i):
            skipped.append((pos, i))
            continue
        wids, wpos = per_worker.setdefault(owner[i], ([], []))
        wids.append(i)
        wpos.append(pos)
    return per_worker, skipped


#: Worker ``w`` of a pool whose workers hold contiguous env ids holds ``span`` (a range,
#: never empty): ``(w, span)`` per worker, built once per pool (`spans_of`)
Spans = list[tuple[int, range]]


def spans_of(slices: Sequence[Sequence[int]], num_envs: int) -> Spans | None:
    """Each non-empty worker's span when the slices are ``0 .. num_envs - 1`` in order, else
    None.

    >>> spans_of([[0, 1], [], [2]], 3), spans_of([[1], [0]], 2)
    ([(0, range(0, 2)), (2, range(2, 3))], None)
    """
    if [i for ids in slices for i in ids] != list(range(num_envs)):
        return None
    out, pos = [], 0
    for w, ids in enumerate(slices):
        if ids:
            out.append((w, range(pos, pos + len(ids))))
        pos += len(ids)
    return out


def step_requests(ticket: Ticket, action_lists: list[Any], single: bool,
                  owner: Sequence[int], spans: Spans | None,
                  failed: Callable[[int], bool] | None
                  ) -> tuple[list[tuple[int, Pending]], list[tuple[int, int]]]:
    """One step request per worker for the envs of ``ticket``; ``spans`` (`spans_of`) for a
    whole-pool call with no failed env: a range and a list slice per worker, no per-env work.
    Also ``(position, env_id)`` of the ``failed`` envs (no request)."""
    op = STEP_OPS[single]
    if spans is not None:
        # the hot path: no Python call per worker but `Pending` (a loop: a comprehension is
        # a call of its own before Python 3.12)
        out = []
        for w, span in spans:
            out.append((w, Pending(step_request((span, action_lists[span.start:span.stop],
                                                 single)), ticket, span, op)))
        return out, []
    per_worker, skipped = split(ticket.env_ids, owner, failed)
    return [(w, Pending(step_request((wids, [action_lists[p] for p in wpos], single)),
                        ticket, wpos, op))
            for w, (wids, wpos) in per_worker.items()], skipped


def reset_requests(ticket: Ticket, base: int | Mapping[int, int], group_ids: Sequence[int],
                   owner: Sequence[int]) -> list[tuple[int, Pending]]:
    """One reset request per worker for the envs of ``ticket``: group ``g`` gets seed
    ``base + g`` (``base[g]`` when ``base`` maps groups to seeds); a worker resets one
    member of each group slice it holds and copies it."""
    seed_of = base.__getitem__ if isinstance(base, Mapping) else base.__add__
    out = []
    for w, (wids, wpos) in split(ticket.env_ids, owner)[0].items():
        groups: dict[int, list[int]] = {}
        for i in wids:
            groups.setdefault(group_ids[i], []).append(i)
        request = ResetRequest([(seed_of(g), members) for g, members in groups.items()])
        pos_of = dict(zip(wids, wpos))
        out.append((w, Pending(request, ticket, [pos_of[i] for i in request.env_ids])))
    return out


def restore_request(items: list[tuple[int, int, list[Any]]]) -> Pending:
    """A restore of these envs (``(env_id, seed, turns)``); its results go to no caller."""
    return Pending(RestoreRequest(items), None, [])


def alone(straggler: Straggler) -> Pending:
    """A straggler's turn as a request of its own (marked retried)."""
    head, k = straggler.head, straggler.k
    request = head.request
    assert isinstance(request, StepRequest)
    retry = Pending(StepRequest([straggler.env_id], [request.actions[k]], request.single),
                    head.ticket, [head.positions[k]])
    retry.retried = True
    return retry


def without(head: Pending, guilty: set[int]) -> Pending | None:
    """``head`` again without the ``guilty`` envs (marked retried); None if none is left."""
    request = head.request
    pos_of = dict(zip(head.env_ids, head.positions))
    new: RequestRecord
    if isinstance(request, ResetRequest):
        # a group whose leader failed gets a new leader
        new = ResetRequest([(seed, kept) for seed, members in request.groups
                            if (kept := [i for i in members if i not in guilty])])
    elif isinstance(request, StepRequest):
        keep = [k for k, i in enumerate(head.env_ids) if i not in guilty]
        new = StepRequest([head.env_ids[k] for k in keep], [request.actions[k] for k in keep],
                          request.single)
    else:
        return None
    if not new.env_ids:
        return None
    retry = Pending(new, head.ticket, [pos_of[i] for i in new.env_ids])
    retry.retried = True
    return retry


def keeping(head: Pending, keep: list[int]) -> Pending:
    """A step request of ``head`` for its envs at indices ``keep`` only (not a retry)."""
    request = head.request
    assert isinstance(request, StepRequest)
    return Pending(StepRequest([head.env_ids[k] for k in keep],
                               [request.actions[k] for k in keep], request.single),
                   head.ticket, [head.positions[k] for k in keep])
