"""The worker protocol: the messages between `EnvPool` and the workers that hold its envs.

The pool (``turnpool/pool/``) decides *what* is computed: groups, seeds, which env gets which
actions, deadlines and fault recovery. A backend (``turnpool/backends/``) decides *where*: it
places a fixed slice of env ids in each of its workers for the worker's whole life and moves
one request to a worker and one reply back. Inside every worker an `EnvHost` answers the
requests. This module is what all three share; it depends on nothing but the envs.

The pool builds one typed record per request (``ResetRequest``, ``SnapshotRequest``, ...)
and reads each reply as a `WorkerReply`; `encode` / `decode` are the one codec between those
records and the wire. Failure classes are the `Failure` enum (a member is its string).

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
  env executes its actions in order and stops at the first done. Reply payload
  ``(results, failed)``: per env, in request order, a `TurnResult`'s fields as a plain tuple
  (`WireTurn`: pickling a NamedTuple calls Python code per object and costs several times a
  plain tuple, which counts for microsecond envs; the pool makes them `TurnResult` records
  as replies arrive, with `as_turn_results`), and the indices of the results whose ``error``
  is set (so the pool need not scan every result).
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
* `Op.CLOSE`: close every env; no reply is needed.
* Replies only, from a process worker whose env stalled (`turnpool.worker.handoff`): an
  `Op.PARTIAL` reply to a step request carries ``(results, pending)``, where ``results`` has
  ``None`` at the envs still running and ``pending`` lists ``(index, since)`` for each of
  them; each later arrives in an `Op.LATE` reply (same number): ``[(env_id, wire_turn)]``.

A new op: one `Op` member (its deadline in `Op.limit`), one record here, one `EnvHost` handler.
Backends never look inside payloads. Sequence numbers are chosen by the pool and echoed by the
worker; the pool discards any reply whose number it is not waiting for (a late reply from a
worker it gave up on).

Failures travel as data: every failed env's result carries its class in ``info["failure"]``
and `TurnResult.failure`, set where it is decided (the host, the deadline, the backend, the
pool); nothing reads a class out of a message text. A worker that dies, or that the pool finds
stuck past its deadline, is replaced by ``Backend.restart``; the pool then identifies the env
that was running from ``Backend.progress``, flags it, and restores the others by reset +
replay (deterministic envs make this exact).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

from turnpool.envs.base import TextEnv
from turnpool.envs.registry import make


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

    @property
    def is_turn(self) -> bool:
        """A step request (multi-action or one bare action per env)."""
        return self is Op.STEP or self is Op.STEP1

    def limit(self, step_timeout: float | None, reset_timeout: float | None
              ) -> float | None:
        """The deadline of one env's share of this request (restore = reset + replay)."""
        if self.is_turn:
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
        return "reset timeout" if self is Op.RESET else "step timeout"


#: ``(seq, op, payload)``: a request on the wire (`encode`)
Request = tuple[int, Op, Any]
#: ``(seq, op, payload, failure, error)``: a reply on the wire (`decode`); ``failure`` /
#: ``error`` set when the request as a whole failed
Reply = tuple[int, Op, Any, "str | None", "str | None"]


# ---------------------------------------------------------------------- typed records
# One record per op the pool sends (immutable tuples, with ``op``, ``env_ids``, ``payload``).
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


class RestoreRequest(NamedTuple):
    """`Op.RESTORE`: ``items`` is ``[(env_id, seed, [turn, ...]), ...]``."""

    items: list[tuple[int, int, list[Any]]]

    @property
    def op(self) -> Op:
        return Op.RESTORE

    @property
    def env_ids(self) -> list[int]:
        return [item[0] for item in self.items]

    @property
    def payload(self) -> Any:
        return self.items


class SnapshotRequest(NamedTuple):
    """`Op.SNAPSHOT`: the states of ``env_ids``."""
    env_ids: list[int]

    @property
    def op(self) -> Op:
        return Op.SNAPSHOT

    @property
    def payload(self) -> Any:
        return self.env_ids


class LoadRequest(NamedTuple):
    """`Op.LOAD`: ``items`` is ``[(env_id, seed, turns, state or None), ...]``."""
    items: list[tuple[int, int, Sequence[Sequence[Any]], Any]]

    @property
    def op(self) -> Op:
        return Op.LOAD

    @property
    def env_ids(self) -> list[int]:
        return [item[0] for item in self.items]

    @property
    def payload(self) -> Any:
        return self.items


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
                 | ForkRequest | CloseRequest)


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

#: Cap on the length of an error text carried in ``info["error"]``.
MAX_ERROR_CHARS = 300
#: Seconds one env may spend on one turn when the caller names no ``step_timeout`` (the pool,
#: ``turnpool serve`` and the trainers' leases all default to it).
DEFAULT_STEP_TIMEOUT = 30.0
#: Seconds a backend may take to start all its workers before the pool gives up on it.
START_TIMEOUT = 120.0
#: The start method of process-based backends when the caller names none: safe when the
#: caller has threads (CUDA, tokenizers), unlike ``fork``.
DEFAULT_MP_CONTEXT = "spawn"


class Failure(str, enum.Enum):
    """Why an env failed, as carried in ``info["failure"]`` of every failed env (with
    ``info["retryable"]``): the one list of failure classes. A member is its string (``==``,
    ``hash``, ``str``, f-strings and JSON all see ``"env_error"`` etc.), so infos and metrics
    keyed by class name are unchanged; infos hold the plain string (`failure_info`).

    >>> Failure.of(None), Failure.of("timeout").retryable, f"{Failure.WORKER_LOST}"
    (<Failure.ENV_ERROR: 'env_error'>, True, 'worker_lost')
    """

    ENV_ERROR = "env_error"              # env code raised
    TIMEOUT = "timeout"                  # a step or reset ran past its deadline
    WORKER_LOST = "worker_lost"          # the worker holding the env died (or was killed)
    UNPICKLABLE = "unpicklable"          # an action or result could not cross a process boundary
    POLICY_ERROR = "policy_error"        # the policy could not produce a reply for the env
    CONSTRUCT_ERROR = "construct_error"  # the env could not be built
    SANDBOX_ERROR = "sandbox_error"      # the sandbox running the env's untrusted code failed

    # print as the plain string (as `enum.StrEnum` does, which Python 3.10 lacks)
    __str__ = str.__str__
    __format__ = str.__format__  # type: ignore[assignment]

    @property
    def retryable(self) -> bool:
        """Whether running the episode again from the same seed can succeed (the env itself
        is not to blame)."""
        return self in _RETRYABLE

    @classmethod
    def of(cls, value: object) -> Failure:
        """The class ``value`` names (a member or its string); `ENV_ERROR` when it names none
        (``None``, an unknown word): the one reading of a failure class."""
        try:
            return _BY_NAME.get(value, Failure.ENV_ERROR)  # type: ignore[call-overload]
        except TypeError:  # unhashable: names no class
            return Failure.ENV_ERROR


_RETRYABLE = frozenset({Failure.TIMEOUT, Failure.WORKER_LOST, Failure.POLICY_ERROR,
                        Failure.SANDBOX_ERROR})
_BY_NAME: dict[str, Failure] = {f.value: f for f in Failure}

#: Failure class name -> retryable, for readers that want plain strings (`Failure` is the
#: source).
FAILURE_CLASSES: dict[str, bool] = {f.value: f.retryable for f in Failure}


def failure_of_exception(exc: BaseException) -> Failure:
    """The class of an exception raised by env code: `Failure.SANDBOX_ERROR` when the sandbox
    that runs the env's untrusted code failed (`turnpool.sandbox.SandboxError`), else
    `Failure.ENV_ERROR`."""
    from turnpool.sandbox import SandboxError
    return Failure.SANDBOX_ERROR if isinstance(exc, SandboxError) else Failure.ENV_ERROR


class BackendUnavailable(RuntimeError):
    """A backend could not start (missing package, start-method failure, worker import error)."""


class WorkerLost(RuntimeError):
    """A worker died (or was declared dead) before replying."""


class EnvBuildError(RuntimeError):
    """A backend's workers could not build some envs; ``errors`` maps env id -> cause.

    Raised by ``Backend.start`` (never turned into `BackendUnavailable`: the envs, not the
    backend, are broken, so no other backend would do better); the pool names the env type,
    tag and kwargs of the first one.
    """

    def __init__(self, errors: dict[int, str]) -> None:
        self.errors = dict(errors)
        env_id, why = sorted(self.errors.items())[0]
        more = len(self.errors) - 1
        super().__init__(f"env {env_id} could not be built: {why}"
                         + (f" (and {more} more)" if more else ""))


class TurnResult(NamedTuple):
    """One env's outcome for a (possibly multi-action) turn: THE step result, from the host
    through every backend to the pool's callers. Read it by field name.

    ``reward_sum`` adds the rewards of the executed actions; execution stops at the first
    done, so ``n_executed`` may be less than the number of actions sent.
    """

    obs: str
    reward_sum: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]
    n_executed: int
    error: str | None

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    @property
    def failure(self) -> Failure | None:
        """The failure class (`Failure`) when ``error`` is set, else None: the
        ``info["failure"]`` field set where the failure was decided (the record stays seven
        plain fields on the wire, which counts for microsecond envs)."""
        return failure_of(self.info) if self.error is not None else None


#: A `TurnResult` on the wire: the same fields, in the same order, as a plain tuple.
WireTurn = tuple[str, float, bool, bool, dict[str, Any], int, str | None]

_as_turn_result = partial(tuple.__new__, TurnResult)


def as_turn_results(wire: Sequence[Any]) -> list[TurnResult]:
    """The `TurnResult` records of a step reply (C-speed: no Python call per env)."""
    return list(map(_as_turn_result, wire))


class StateResult(NamedTuple):
    """An env's `Op.SNAPSHOT` answer: ``get_state()`` (None: branched by replay), done, error."""

    state: Any
    finished: bool
    error: str | None


class ResetResult(NamedTuple):
    """One env's outcome for a reset: its first observation and info, or the error."""

    obs: str
    info: dict[str, Any]
    error: str | None

    @property
    def failure(self) -> Failure | None:
        """The failure class when ``error`` is set (as `TurnResult.failure`)."""
        return failure_of(self.info) if self.error is not None else None


@dataclass(frozen=True)
class EnvBuild:
    """How to build env ``env_id`` in any process: an entry point string and its kwargs.

    The pool resolves registered names to ``"module.path:ClassName"`` before shipping, so envs
    registered only in the parent still build in spawned workers.
    """

    env_id: int
    entry_point: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    #: build it at its first reset (or restore) instead of when its worker starts
    lazy: bool = False

    def build(self) -> TextEnv:
        return make(self.entry_point, **self.kwargs)


def short_error(exc: BaseException) -> str:
    """``"<ExcType>: message"``, bounded so a huge message cannot bloat replies."""
    return bounded(f"{type(exc).__name__}: {exc}")


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def bounded(text: str) -> str:
    """``text`` without terminal colour codes, cut to `MAX_ERROR_CHARS`.

    A long text (a remote traceback) keeps its head and its last line: the last line of a
    traceback names the exception that was finally raised, which is the cause a user needs.
    """
    text = _ANSI.sub("", text)
    if len(text) <= MAX_ERROR_CHARS:
        return text
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    tail = lines[-1][-(MAX_ERROR_CHARS // 2):] if len(lines) > 1 else ""
    head = MAX_ERROR_CHARS - len(tail) - 5
    return text[:head].rstrip() + " ... " + tail if tail else text[: MAX_ERROR_CHARS - 3] + "..."


def failure_info(failure: str) -> dict[str, Any]:
    """``{"failure": failure, "retryable": ...}`` for a class of `Failure` (the info holds
    the plain string)."""
    if failure not in _BY_NAME:
        raise ValueError(f"unknown failure class {failure!r}; one of {list(FAILURE_CLASSES)}")
    cls = _BY_NAME[failure]
    return {"failure": cls.value, "retryable": cls.retryable}


def failure_of(info: Mapping[str, Any]) -> Failure:
    """The failure class of a failed env's info (`Failure.ENV_ERROR` when it names none)."""
    return Failure.of(info.get("failure"))


def error_info(reason: str, failure: str = "env_error") -> dict[str, Any]:
    """The info dict of a failed env: the standard keys (so readers never KeyError), the
    error and its failure class."""
    return {"success": False, "action_is_valid": False, "action_is_effective": False,
            "anchor_obs": "", "terminated": False, "truncated": True, "error": reason,
            **failure_info(failure)}


def error_step(reason: str, n_executed: int = 0, failure: str = "env_error") -> TurnResult:
    """A failed env's step result: done (truncated: the episode was cut, not finished), 0 reward."""
    return TurnResult("", 0.0, False, True, error_info(reason, failure), n_executed, reason)


def error_reset(reason: str, failure: str = "env_error") -> ResetResult:
    """A failed env's reset result."""
    return ResetResult("", error_info(reason, failure), reason)


def failed_reply(request: Request, reason: str, failure: str) -> Reply:
    """The reply to a request that failed as a whole: every env of it fails with ``failure``."""
    return (request[0], request[1], None, failure, reason)


def split_evenly(env_ids: Sequence[int], num_workers: int) -> list[list[int]]:
    """Contiguous, near-equal slices (groups are contiguous, so most stay in one worker)."""
    n = len(env_ids)
    w = max(1, min(num_workers, n)) if n else 1
    bounds = [round(k * n / w) for k in range(w + 1)]
    return [list(env_ids[bounds[k]:bounds[k + 1]]) for k in range(w)]
