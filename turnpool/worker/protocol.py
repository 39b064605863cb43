"""The worker protocol: the messages between `EnvPool` and the workers that hold its envs.

The pool (``turnpool/pool/``) decides *what* is computed: groups, seeds, which env gets which
actions, deadlines and fault recovery. A backend (``turnpool/backends/``) decides *where*: it
places a fixed slice of env ids in each of its workers for the worker's whole life and moves
one request to a worker and one reply back. Inside every worker an `EnvHost` answers the
requests. This module is the wire they share: the ops and their table (`OPS`), one request
record per op, the reply payloads, and the one codec (`encode` / `decode`). Its neighbours
hold the rest of what crosses the wire: `turnpool.worker.results` (per-env result records),
`turnpool.worker.failures` (the `Failure` classes), `turnpool.worker.errors` (backend
exceptions, error texts), `turnpool.worker.build` (`EnvBuild`, env placement) and
`turnpool.worker.defaults`.

Wire format (plain tuples; a process backend pickles them once per worker per call):

* request ``(seq, op, payload)`` with ``op`` an `Op`; reply ``(seq, op, payload, failure,
  error)``: ``failure`` and ``error`` are ``None`` unless the request failed as a whole (the
  host itself, a deadline between two envs, a transport that could not carry it); then
  ``failure`` is its class (`Failure`) and every env of the request is failed with it.
* `Op.RESET`: payload ``[(seed, [env_id, ...]), ...]``: one entry per group slice owned by
  this worker. The host resets the first env with ``seed`` and copies its state to the others
  (``get_state`` / ``set_state``), falling back to resetting each with the same seed if the env
  cannot be copied. Reply payload: one `ResetResult` per env id, in request order.
* `Op.STEP`: payload ``(env_ids, action_lists)`` (``env_ids`` may be a ``range``). Each
  env executes its actions in order and stops at the first done. Reply payload a
  `StepReply` ``(results, failed)``: per env, in request order, a `TurnResult`'s fields as
  a plain tuple (`WireTurn`: pickling a NamedTuple calls Python code per object and costs
  several times a plain tuple, which counts for microsecond envs; the pool makes them
  `TurnResult` records as replies arrive, with `as_turn_results`), and the indices of the
  results whose ``error`` is set (so the pool need not scan every result).
* `Op.STEP1`: the same with one bare action per env instead of a list (the common
  ``pool.step`` case, which saves building and pickling a list per env).
* `Op.RESTORE`: payload ``[(env_id, seed, [[action, ...], ...]), ...]``: rebuild the env,
  reset it with ``seed`` and replay its turns with the same stop-at-first-done rule (the pool
  uses this to bring back the innocent envs of a worker that was killed). Reply payload: one
  ``error`` (``None`` on success) per env.
* `Op.SNAPSHOT`: payload ``[env_id, ...]``; reply: one `StateResult` per env.
* `Op.LOAD`: payload ``[(env_id, seed, [turn, ...], state), ...]``: ``set_state``, or reset +
  replay (as `Op.RESTORE`) where ``state`` is None; reply: a `ResetResult` per env (render).
* `Op.FORK`: payload ``(src, [(dst_id, seed, [turn, ...]), ...])``: `Op.SNAPSHOT` of ``src``
  and `Op.LOAD` of its state into each destination, in one message (all on ``src``'s
  worker); reply: ``src``'s `StateResult`, then a `ResetResult` per destination (``None``
  each when ``src`` cannot be branched).
* `Op.CALL`: payload ``[(env_id, name, args, kwargs), ...]``: each env's attribute ``name``,
  called with ``args`` / ``kwargs`` when callable (gymnasium's vector ``call``); reply: one
  `CallResult` per env (its value, which the host has checked pickles, or its error).
* `Op.SET_ATTR`: payload ``[(env_id, name, value), ...]``: ``setattr`` on each env; reply: a
  `CallResult` per env (value ``None``).
* `Op.CLOSE`: close every env; no reply is needed.
* Replies only, from a process worker whose env stalled (`turnpool.worker.handoff`): an
  `Op.PARTIAL` reply to a step request carries a `PartialReply` ``(results, pending)``,
  where ``results`` has ``None`` at the envs still running and ``pending`` lists
  ``(index, since)`` for each of them; each later arrives in an `Op.LATE` reply (same
  number): ``[(env_id, wire_turn)]``.

A new op: one `Op` member (its deadline in `Op.limit`), one record here and its row in `OPS`
(the record, the `EnvHost` method that answers it, its reply's `ReplyKind`), and that
`EnvHost` method. The dispatcher files a reply and the transport replaces unpicklable items
by the reply's kind, so an op whose reply is of a known kind touches neither (recipe in
``docs/design.md``). Backends never look inside payloads. Sequence numbers are chosen by the
pool and echoed by the worker; the pool discards any reply whose number it is not waiting
for (a late reply from a worker it gave up on).

Failures travel as data (`turnpool.worker.failures`): every failed env's result carries its
class in ``info["failure"]`` and `TurnResult.failure`, set where it is decided (the host, the
deadline, the backend, the pool); nothing reads a class out of a message text. A worker that
dies, or that the pool finds stuck past its deadline, is replaced by ``Backend.restart``; the
pool then identifies the env that was running from ``Backend.progress``, flags it, and
restores the others by reset + replay (deterministic envs make this exact).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar, Generic, NamedTuple, TypeVar

from turnpool.worker.failures import Failure
from turnpool.worker.results import CallResult, ResetResult, StateResult, WireTurn


class Op(enum.IntEnum):
    """What a request asks a worker's host to do (see the module docstring for payloads)."""

    RESET = 1
    STEP = 2
    STEP1 = 3
    RESTORE = 4
    CLOSE = 5
    #: replies only, from a worker that hands a stalled step off (`turnpool.worker.handoff`)
    PARTIAL = 6
    LATE = 7
    SNAPSHOT = 8  # branching (`turnpool.pool.branch`)
    LOAD = 9
    FORK = 10
    CALL = 11  # an env's method or attribute (`turnpool.pool.calls`)
    SET_ATTR = 12

    def __reduce_ex__(self, protocol: object) -> str:  # type: ignore[override]
        # by its qualified name (``Op.STEP1``): unpickling finds the member in C, where
        # `Enum`'s own reduce calls ``Op(value)`` in Python; every request and reply carries
        # an op, so this is paid per message on both sides of the wire
        return _OP_NAMES[self]

    @property
    def is_turn(self) -> bool:
        """A step request (multi-action or one bare action per env)."""
        return self is Op.STEP or self is Op.STEP1

    def limit(self, step_timeout: float | None, reset_timeout: float | None
              ) -> float | None:
        """The deadline of one env's share of this request (restore = reset + replay; a
        call into an env is held to a step's)."""
        if self.is_turn or self is Op.CALL or self is Op.SET_ATTR:
            return step_timeout
        if self is Op.RESET:
            return reset_timeout
        if reset_timeout is None or step_timeout is None:
            return None
        return reset_timeout + step_timeout

    @staticmethod
    def limits(step_timeout: float | None, reset_timeout: float | None
               ) -> dict[Op, float | None]:
        """`limit` of every op (backends and the pool look deadlines up per request)."""
        return {op: op.limit(step_timeout, reset_timeout) for op in Op}

    @property
    def timeout_text(self) -> str:
        """How a deadline missed by this request is named in ``info["error"]``."""
        if self is Op.CALL or self is Op.SET_ATTR:
            return "call timeout"
        return "reset timeout" if self is Op.RESET else "step timeout"


_OP_NAMES = {op: f"Op.{op.name}" for op in Op}
#: Members read per request or reply on the hot paths: a module global is a dict lookup,
#: ``Op.X`` (an attribute of the enum class) and `Op.is_turn` cost a Python-level lookup each.
OP_CLOSE, OP_LATE, OP_STEP, OP_STEP1 = Op.CLOSE, Op.LATE, Op.STEP, Op.STEP1

#: ``(seq, op, payload)``: a request on the wire (`encode`)
Request = tuple[int, Op, Any]
#: ``(seq, op, payload, failure, error)``: a reply on the wire (`decode`); ``failure`` /
#: ``error`` set when the request as a whole failed
Reply = tuple[int, Op, Any, "str | None", "str | None"]


# ---------------------------------------------------------------------- request payloads
#: `Op.RESET`: ``[(seed, [env_id, ...]), ...]``
ResetPayload = Sequence[tuple[int, Sequence[int]]]
#: `Op.STEP` / `Op.STEP1`: ``(env_ids, actions)``
StepPayload = tuple[Sequence[int], Sequence[Any]]
#: `Op.RESTORE`: ``[(env_id, seed, turns), ...]``
RestorePayload = Sequence[tuple[int, int, Sequence[Sequence[Any]]]]
#: `Op.SNAPSHOT`: ``[env_id, ...]``
SnapshotPayload = Sequence[int]
#: `Op.LOAD`: ``[(env_id, seed, turns, state or None), ...]``
LoadPayload = Sequence[tuple[int, int, Sequence[Sequence[Any]], Any]]
#: `Op.FORK`: ``(src, [(dst_id, seed, turns), ...])``
ForkPayload = tuple[int, Sequence[tuple[int, int, Sequence[Sequence[Any]]]]]
#: `Op.CALL`: ``[(env_id, name, args, kwargs), ...]``
CallPayload = Sequence[tuple[int, str, tuple[Any, ...], dict[str, Any]]]
#: `Op.SET_ATTR`: ``[(env_id, name, value), ...]``
SetAttrPayload = Sequence[tuple[int, str, Any]]


# ---------------------------------------------------------------------- typed records
# One record per op the pool sends (immutable: named tuples or frozen dataclasses, each with
# ``op``, ``env_ids`` and ``payload``).
class ResetRequest(NamedTuple):
    """`Op.RESET`: ``groups`` is ``[(seed, [env_id, ...]), ...]``, one entry per group slice."""

    groups: list[tuple[int, list[int]]]

    @property
    def op(self) -> Op:
        return Op.RESET

    @property
    def env_ids(self) -> list[int]:
        return [i for _, members in self.groups for i in members]

    @property
    def seeds(self) -> list[int]:
        """Each env's episode seed, aligned to `env_ids`."""
        return [seed for seed, members in self.groups for _ in members]

    @property
    def payload(self) -> Any:
        return self.groups


class StepRequest(NamedTuple):
    """`Op.STEP` (a list of actions per env) or, ``single``, `Op.STEP1` (one bare action per
    env); ``env_ids`` may be a ``range`` and ``actions`` a list slice (whole-pool calls)."""

    env_ids: Sequence[int]
    actions: Sequence[Any]
    single: bool = False

    @property
    def op(self) -> Op:
        return STEP_OPS[self.single]

    @property
    def payload(self) -> Any:
        return (self.env_ids, self.actions)



ItemT = TypeVar("ItemT", bound=tuple[Any, ...])


@dataclass(frozen=True)
class ItemsRequest(Generic[ItemT]):
    """A request whose payload is its ``items``, one per env, each starting with the env id."""

    items: list[ItemT]
    op: ClassVar[Op]

    @property
    def env_ids(self) -> list[int]:
        return [item[0] for item in self.items]

    @property
    def payload(self) -> list[ItemT]:
        return self.items


@dataclass(frozen=True)
class RestoreRequest(ItemsRequest[tuple[int, int, list[Any]]]):
    """`Op.RESTORE`: ``items`` is ``[(env_id, seed, [turn, ...]), ...]``."""

    op: ClassVar[Op] = Op.RESTORE


@dataclass(frozen=True)
class LoadRequest(ItemsRequest[tuple[int, int, Sequence[Sequence[Any]], Any]]):
    """`Op.LOAD`: ``items`` is ``[(env_id, seed, turns, state or None), ...]``."""

    op: ClassVar[Op] = Op.LOAD


@dataclass(frozen=True)
class CallRequest(ItemsRequest[tuple[int, str, tuple[Any, ...], dict[str, Any]]]):
    """`Op.CALL`: ``items`` is ``[(env_id, name, args, kwargs), ...]``."""

    op: ClassVar[Op] = Op.CALL


@dataclass(frozen=True)
class SetAttrRequest(ItemsRequest[tuple[int, str, Any]]):
    """`Op.SET_ATTR`: ``items`` is ``[(env_id, name, value), ...]``."""

    op: ClassVar[Op] = Op.SET_ATTR


class SnapshotRequest(NamedTuple):
    """`Op.SNAPSHOT`: the states of ``env_ids``."""
    env_ids: list[int]

    @property
    def op(self) -> Op:
        return Op.SNAPSHOT

    @property
    def payload(self) -> Any:
        return self.env_ids



class ForkRequest(NamedTuple):
    """`Op.FORK`: copy env ``src`` into each of ``items`` ``[(dst_id, seed, turns), ...]``
    (``seed`` and ``turns``: ``src``'s episode, for a class branched by replay)."""
    src: int
    items: list[tuple[int, int, Sequence[Sequence[Any]]]]

    @property
    def op(self) -> Op:
        return Op.FORK

    @property
    def env_ids(self) -> list[int]:
        return [self.src, *(item[0] for item in self.items)]

    @property
    def payload(self) -> Any:
        return (self.src, self.items)


class CloseRequest(NamedTuple):
    """`Op.CLOSE`: close every env of the worker (no reply needed)."""

    @property
    def op(self) -> Op:
        return Op.CLOSE

    @property
    def env_ids(self) -> list[int]:
        return []

    @property
    def payload(self) -> Any:
        return None


#: A request the pool sends (one record type per op)
RequestRecord = (ResetRequest | StepRequest | RestoreRequest | SnapshotRequest | LoadRequest
                 | ForkRequest | CallRequest | SetAttrRequest | CloseRequest)


#: The payload of a step reply: per env, in request order, its `WireTurn`; and the indices
#: of the failed ones. Plain tuples, as the turns are (a NamedTuple costs Python code per
#: pickle on the hot path).
StepReply = tuple[list[WireTurn], list[int]]
#: The payload of an `Op.PARTIAL` reply: the results with ``None`` at the envs still running,
#: and ``(index, since)`` for each of those
PartialReply = tuple[list["WireTurn | None"], list[tuple[int, float]]]
#: The payload of an `Op.LATE` reply: ``(env_id, wire_turn)`` per straggler answered
LateReply = list[tuple[int, WireTurn]]
#: The payload of an `Op.RESET` or `Op.LOAD` reply: one per env, in request order
ResetReply = list[ResetResult]
#: The payload of an `Op.RESTORE` reply: each env's error, ``None`` on success
RestoreReply = list["str | None"]
#: The payload of an `Op.SNAPSHOT` reply: one `StateResult` per env
SnapshotReply = list[StateResult]
#: The payload of an `Op.FORK` reply: the source's `StateResult`, then a `ResetResult` per
#: destination (``None`` each if it failed)
ForkReply = list["StateResult | ResetResult | None"]
#: The payload of an `Op.CALL` or `Op.SET_ATTR` reply: one `CallResult` per env
CallReply = list[CallResult]


class ReplyKind(enum.Enum):
    """What a reply's payload holds, which says how the pool files it
    (`turnpool.pool.dispatch`) and how a transport replaces what cannot be pickled
    (`turnpool.worker.transport`): one entry per kind there, not per op."""

    #: `StepReply`: turns, each filed in the env table and delivered
    TURNS = "turns"
    #: `ResetReply` of a reset: each starts an episode (or fails it)
    RESETS = "resets"
    #: `RestoreReply`: each env's error or None (no caller waits for it)
    RESTORED = "restored"
    #: per-env values its caller reads (`turnpool.pool.branch`); not picklable: the whole
    #: request fails
    VALUES = "values"
    #: `PartialReply` and `LateReply` (hand-off)
    PARTIAL = "partial"
    LATE = "late"
    #: no reply
    NONE = "none"


@dataclass(frozen=True)
class OpSpec:
    """One op's row of `OPS`: the record the pool sends (None: replies only), the `EnvHost`
    method that answers it (None: nothing to run) and its reply's kind."""

    record: type | None
    handler: str | None
    reply: ReplyKind


#: The op table: every op, in one place (a new op adds its row; see the module docstring)
OPS: dict[Op, OpSpec] = {
    Op.RESET: OpSpec(ResetRequest, "reset", ReplyKind.RESETS),
    Op.STEP: OpSpec(StepRequest, "step", ReplyKind.TURNS),
    Op.STEP1: OpSpec(StepRequest, "step1", ReplyKind.TURNS),
    Op.RESTORE: OpSpec(RestoreRequest, "restore", ReplyKind.RESTORED),
    Op.CLOSE: OpSpec(CloseRequest, "close", ReplyKind.NONE),
    Op.PARTIAL: OpSpec(None, None, ReplyKind.PARTIAL),
    Op.LATE: OpSpec(None, None, ReplyKind.LATE),
    Op.SNAPSHOT: OpSpec(SnapshotRequest, "snapshot", ReplyKind.VALUES),
    Op.LOAD: OpSpec(LoadRequest, "load", ReplyKind.VALUES),
    Op.FORK: OpSpec(ForkRequest, "fork", ReplyKind.VALUES),
    Op.CALL: OpSpec(CallRequest, "call", ReplyKind.VALUES),
    Op.SET_ATTR: OpSpec(SetAttrRequest, "set_attr", ReplyKind.VALUES),
}
#: `OPS`' reply kinds by op (read per reply on the hot path)
REPLY_KIND: dict[Op, ReplyKind] = {op: spec.reply for op, spec in OPS.items()}



class WorkerReply(NamedTuple):
    """A reply, decoded: ``payload`` is op-specific (module docstring); ``failure`` and
    ``error`` are set when the request failed as a whole."""

    seq: int
    op: Op
    payload: Any
    failure: Failure | None
    error: str | None


_as_worker_reply = partial(tuple.__new__, WorkerReply)
#: `StepRequest.op` by ``single``: ``STEP_OPS[single]`` (read per request on the hot path)
STEP_OPS = (Op.STEP, Op.STEP1)


#: ``step_request((env_ids, actions, single))`` is ``StepRequest(env_ids, actions, single)``
#: at C speed (a NamedTuple's ``__new__`` is Python code): the pool builds one per worker
#: per call.
step_request = partial(tuple.__new__, StepRequest)


def encode(seq: int, request: RequestRecord) -> Request:
    """The wire tuple of ``request`` under sequence number ``seq``.

    >>> encode(7, StepRequest(range(2), ["a", "b"], single=True))
    (7, <Op.STEP1: 3>, (range(0, 2), ['a', 'b']))
    """
    if type(request) is StepRequest:  # the hot case: no property call per field
        return (seq, STEP_OPS[request[2]], request[:2])
    return (seq, request.op, request.payload)


def decode(reply: Reply) -> WorkerReply:
    """The `WorkerReply` of a wire reply tuple.

    >>> decode((7, Op.STEP, None, "timeout", "step timeout (1 s)")).failure.retryable
    True
    """
    if reply[3] is None:  # the common case: no Python call per field
        return _as_worker_reply(reply)
    seq, op, payload, failure, error = reply
    return WorkerReply(seq, op, payload, Failure.of(failure), error)


def failed_reply(request: Request, reason: str, failure: str) -> Reply:
    """The reply to a request that failed as a whole: every env of it fails with ``failure``."""
    return (request[0], request[1], None, failure, reason)


