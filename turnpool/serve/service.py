"""OpenEnv's operations over the session table and the slot engine: what ``reset``, ``step``
and ``state`` do to a session, whichever way they arrive (``/ws``, HTTP, MCP: the faces find
these handlers in the served-verb table, `turnpool.serve.verbs`), and turnpool's branching
extension: ``fork``, ``snapshot`` and ``restore``.

The message shapes are OpenEnv's (``openenv.core``), written here from its documented
protocol so the server needs no OpenEnv install: the client sends ``{"type": "reset" |
"step" | "state" | "close", "data": {...}}`` and gets ``{"type": "observation", "data":
{"observation": {...}, "reward": r, "done": d, "metadata": {...}}}``, ``{"type": "state",
"data": {...}}`` or ``{"type": "error", "data": {"message": ..., "code": ...}}``. A failed env
step is an ``error`` reply whose ``data`` also names turnpool's failure class
(``failure``, ``retryable``), never an observation with reward 0: a trainer must not learn
from a turn that did not happen. Hot paths parse and write JSON by hand (no per-message model
validation).

Branching, beside OpenEnv's types (a stock client never sends them): ``{"type": "fork"}``
answers ``{"type": "fork", "data": {"session_id": new, "observation": ..., ...}}``, a new
held session playing a copy of this one's episode (reach it by id: HTTP, MCP, or
``/ws?session_id=``); ``{"type": "snapshot"}`` answers ``{"type": "snapshot", "data":
{"snapshot": value}}``, a signed JSON value (`turnpool.serve.snapshots`); ``{"type":
"restore", "data": {"snapshot": value}}`` puts the session into that state and answers an
``observation``, as a reset does.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import turnpool.serve.mcp as mcp
from turnpool.pool.slot_requests import (
    Branched,
    ForkSlotRequest,
    LoopWaiter,
    RestoreSlotRequest,
    SnapshotSlotRequest,
)
from turnpool.pool.slots import PoolTimeout, SlotReset
from turnpool.serve.engine import PoolEngine, retryable
from turnpool.serve.errors import ProtocolError
from turnpool.serve.jsonio import MAX_MESSAGE_CHARS
from turnpool.serve.sessions import Session, SessionTable
from turnpool.serve.snapshots import SnapshotCodec
from turnpool.worker.failures import Failure
from turnpool.worker.results import TurnResult

#: A call in flight: the engine's future, or the ``/ws`` fast path's `LoopWaiter`
W = TypeVar("W", bound="asyncio.Future[Any] | LoopWaiter")


class Service:
    """The sessions (`SessionTable`) over one `PoolEngine`, and the handlers of the served
    verbs (`turnpool.serve.verbs.VERBS` says which face reaches which)."""

    def __init__(self, engine: PoolEngine, token: str | None = None, id_prefix: str = "",
                 on_sessions: Callable[[], None] | None = None) -> None:
        self.engine = engine
        self.settings = engine.settings
        self.token = token
        self.sessions = SessionTable(engine, engine.settings, id_prefix, on_sessions)
        self.tools = mcp.Tools(engine.settings.env, dict(engine.settings.env_kwargs))
        self.snapshots = SnapshotCodec(self.settings.env, self.settings.snapshot_key,
                                       self.settings.max_action_chars,
                                       self.settings.max_actions_per_step)
        #: observes each step's time in the server (`turnpool.serve.metrics`), if any
        self.observe_step: Callable[[float], None] | None = None

    def authorized(self, headers: Any, query: Any) -> bool:
        if self.token is None:
            return True
        given = query.get("token") or ""
        auth = headers.get("authorization") or ""
        if auth.lower().startswith("bearer "):
            given = auth[7:].strip()
        return secrets.compare_digest(given.encode(), self.token.encode())

    # ------------------------------------------------------------------ operations
    async def reset(self, session: Session, data: dict[str, Any]) -> dict[str, Any]:
        """A reset on the general path (HTTP, MCP): `begin_reset`, the engine's reset,
        `finish_reset`."""
        seed, episode_id = self.begin_reset(session, data)
        fut = self.submit(session, lambda: self.engine.reset_future(session.slot, seed))
        out, failure = await self._outcome(session, fut)
        return self.finish_reset(session, out, failure, episode_id)

    async def _outcome(self, session: Session, fut: Awaitable[Any]
                       ) -> tuple[Any, Exception | None]:
        """``fut``'s result or failure (the finish half maps it); a caller that went away
        ends the session's call."""
        try:
            return await fut, None
        except Exception as exc:
            return None, exc
        except BaseException:  # the caller went away: the call is no longer its
            self.sessions.end_call(session)
            raise

    # The begin/finish pair of a reset, as of a step: `reset` above and the ``/ws`` fast path.
    def begin_reset(self, session: Session, data: dict[str, Any]) -> tuple[int | None, Any]:
        """The checked ``(seed, episode_id)`` of a reset message's data for ``session``;
        `ProtocolError` if the data or a call already running refuses it. Submit the reset
        with `submit`."""
        seed = data.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)
                                 or seed < 0):
            raise ProtocolError("VALIDATION_ERROR", "seed must be a non-negative integer")
        episode_id = data.get("episode_id")
        if episode_id is not None and (not isinstance(episode_id, str) or len(episode_id) > 255):
            raise ProtocolError("VALIDATION_ERROR", "episode_id must be a string of <= 255 chars")
        if session.busy:
            raise _busy()
        return seed, episode_id

    def finish_reset(self, session: Session, out: SlotReset | None, exc: BaseException | None,
                     episode_id: Any) -> dict[str, Any]:
        """The observation payload of ``session``'s reset, answered ``out`` or failed with
        ``exc``: the call ends and the session starts its episode; `ProtocolError` for a
        failed reset, a late one (the sweep's `PoolTimeout`) or a pool that went away."""
        self.sessions.end_call(session)
        if isinstance(exc, PoolTimeout):
            raise self.timed_out(session, exc)
        if exc is not None or out is None:  # shutting down / the pool is closed
            raise ProtocolError("EXECUTION_ERROR", str(exc) or "cancelled", status=503)
        session.step_count = 0
        if out.error is not None:
            session.started, session.done, session.seed = False, True, None
            session.failures += 1
            raise failed(out.failure, out.error, session)
        session.started, session.done = True, False
        session.seed = out.seed
        session.episode_id = episode_id if episode_id is not None else uuid.uuid4().hex
        self.sessions.journal.reset(session.id, session.seed)
        return payload(session, out.obs, None, False, False, out.info)

    async def step(self, session: Session, data: Any) -> dict[str, Any]:
        """One step on the general path (HTTP, MCP, a ``/ws`` step the fast path left):
        `begin_step`, the engine's step, `finish_step`."""
        actions = self.begin_step(session, data)
        fut = self.submit(session, lambda: self.engine.step_future(session.slot, actions))
        began = time.perf_counter()
        result, failure = await self._outcome(session, fut)
        return self.finish_step(session, result, failure, began)

    # The one begin/finish pair of a served step, whichever path submits it (`step` above,
    # `turnpool.serve.ws.WsConnection`'s fast path with its batcher): the checks and the
    # session's record before, the bookkeeping, error mapping and journal after.
    def begin_step(self, session: Session, data: Any) -> list[Any]:
        """The checked actions of a step message for ``session``, now its pending turn
        (``session.actions``, journalled by `finish_step`); `ProtocolError` if the message,
        the session's episode or a call already running refuses it. Submit them with
        `submit`."""
        actions = parse_actions(data, self.settings.max_action_chars,
                                self.settings.max_actions_per_step)
        if not session.started:
            raise ProtocolError("VALIDATION_ERROR", "no episode: send reset first")
        if session.done:
            raise ProtocolError("VALIDATION_ERROR", "the episode is over: send reset")
        if session.busy:
            raise _busy()
        session.actions = actions
        return actions

    def finish_step(self, session: Session, res: TurnResult | None,
                    exc: BaseException | None, began: float) -> dict[str, Any]:
        """The observation payload of ``session``'s step, answered ``res`` or failed with
        ``exc`` (begun at ``began``, perf_counter): the call ends, the session's count,
        episode flags and journal take the turn. `ProtocolError` for a failed turn, a late
        one (the sweep's `PoolTimeout`) or a pool that went away."""
        self.sessions.end_call(session)
        if isinstance(exc, PoolTimeout):  # the session table's sweep: too late
            raise self.timed_out(session, exc)
        if exc is not None or res is None:  # shutting down / the pool is closed
            raise ProtocolError("EXECUTION_ERROR", str(exc) or "cancelled", status=503)
        if self.observe_step is not None:
            self.observe_step(time.perf_counter() - began)
        if res.error is not None:
            session.done = True
            session.failures += 1
            session.step_count += 1
            raise failed(res.failure, res.error, session)
        session.step_count += res.n_executed
        session.done = res.terminated or res.truncated
        self.sessions.journal.step(session.id, session.actions)
        return payload(session, res.obs, res.reward_sum, res.terminated, res.truncated,
                       res.info, res.n_executed)

    # ------------------------------------------------------------------ branching
    async def fork(self, session: Session) -> dict[str, Any]:
        """A new held session (kind ``http``: reach it by id over HTTP, MCP or
        ``/ws?session_id=``) playing a copy of ``session``'s episode; its observation
        payload with ``session_id``. ``CAPACITY_REACHED`` as for any new session."""
        self._branchable(session)
        new = self.sessions.open("http", near=session)
        try:
            out: Branched = await self._call(session, lambda: self.engine.branch_future(
                lambda waiter: ForkSlotRequest(session.slot, new.slot, waiter)))
        except ValueError as exc:  # the pool refused it, or the copy failed
            self.sessions.close(new)
            raise ProtocolError("EXECUTION_ERROR", f"fork failed: {exc}", status=409,
                                session_id=session.id) from exc
        except BaseException:
            self.sessions.close(new)
            raise
        new.episode_id = uuid.uuid4().hex
        reply = self._branched(new, out)
        return {"session_id": new.id, **reply}

    async def snapshot(self, session: Session) -> dict[str, Any]:
        """``session``'s episode as a JSON value (`turnpool.serve.snapshots`)."""
        self._branchable(session)
        snap = await self._call(session, lambda: self.engine.branch_future(
            lambda waiter: SnapshotSlotRequest(session.slot, waiter)))
        return self.snapshots.encode(snap)

    async def restore(self, session: Session, data: Any) -> dict[str, Any]:
        """Put ``session`` into the state of ``data["snapshot"]``; its observation payload,
        as a reset answers. A snapshot refused here leaves the session as it was; one the
        pool could not restore ends its episode (send reset)."""
        if not isinstance(data, dict) or set(data) - {"snapshot", "session_id"} or \
                "snapshot" not in data:
            raise ProtocolError("VALIDATION_ERROR", "restore data must be an object with "
                                "'snapshot'")
        snap = self.snapshots.decode(data["snapshot"])
        try:
            out: Branched = await self._call(session, lambda: self.engine.branch_future(
                lambda waiter: RestoreSlotRequest(session.slot, snap, waiter)))
        except ValueError as exc:
            session.started, session.done = False, True
            raise ProtocolError("EXECUTION_ERROR", f"restore failed: {exc}", status=409,
                                session_id=session.id) from exc
        session.episode_id = uuid.uuid4().hex
        return self._branched(session, out)

    def _branchable(self, session: Session) -> None:
        if not session.started:
            raise ProtocolError("VALIDATION_ERROR", "no episode: send reset first")
        if session.done:
            raise ProtocolError("VALIDATION_ERROR", "the episode is over: there is nothing "
                                "to branch")

    def _branched(self, session: Session, out: Branched) -> dict[str, Any]:
        """``session`` now plays ``out.snapshot``'s episode: journal it, answer its
        observation."""
        snap = out.snapshot
        session.started, session.done, session.seed = True, False, snap.seed
        session.step_count = sum(len(t) for t in snap.turns)
        self.sessions.journal.branched(session.id, snap.seed, snap.turns)
        return payload(session, out.obs, None, False, False, out.info)

    def state(self, session: Session | None) -> dict[str, Any]:
        """``session``'s state (a blank one for None: HTTP ``/state`` naming no session)."""
        if session is None:
            return {"episode_id": None, "step_count": 0, "seed": None, "session_id": None,
                    "env": self.settings.env, "done": False}
        return {"episode_id": session.episode_id, "step_count": session.step_count,
                "seed": session.seed, "session_id": session.id, "env": self.settings.env,
                "done": session.done}

    async def _call(self, session: Session, start: Callable[[], asyncio.Future[Any]]
                    ) -> Any:
        """Run one engine call of ``session`` (one at a time) under the session table's
        deadline (`SessionTable.sweep` fails it with `PoolTimeout`)."""
        if session.busy:
            raise _busy()
        fut = self.submit(session, start)
        try:
            return await fut
        except PoolTimeout as exc:
            raise self.timed_out(session, exc) from exc
        except RuntimeError as exc:  # the server is shutting down / the pool is closed
            raise ProtocolError("EXECUTION_ERROR", str(exc), status=503) from exc
        finally:
            self.sessions.end_call(session)

    def submit(self, session: Session, start: Callable[[], W]) -> W:
        """``start()`` ``session``'s engine call, now in flight under the session table's
        deadline (the caller ends it: `SessionTable.end_call`)."""
        try:
            fut = start()
        except (RuntimeError, ValueError) as exc:  # shutting down / the pool is closed
            raise ProtocolError("EXECUTION_ERROR", str(exc), status=503) from exc
        self.sessions.begin_call(session, fut)
        return fut

    def timed_out(self, session: Session, exc: Exception) -> ProtocolError:
        """The error of a call the pool did not answer in time (its episode is over)."""
        session.done, session.started = True, False
        return ProtocolError("EXECUTION_ERROR", str(exc), status=504, failure="timeout",
                             retryable=True, session_id=session.id)


def _busy() -> ProtocolError:
    return ProtocolError("EXECUTION_ERROR", "this session is already running a request; "
                         "send one at a time", status=409)


def payload(session: Session, obs: str, reward: float | None, terminated: bool,
            truncated: bool, info: dict[str, Any], n_executed: int = 0) -> dict[str, Any]:
    """An observation message's ``data``."""
    meta = {"session_id": session.id, "episode_id": session.episode_id,
            "seed": session.seed, "step_count": session.step_count,
            "n_executed": n_executed}
    done = terminated or truncated
    return {"observation": {"text": obs, "terminated": terminated, "truncated": truncated,
                            "info": info, "metadata": meta},
            "reward": reward, "done": done, "metadata": meta}


def failed(failure: str | None, error: str, session: Session) -> ProtocolError:
    """The error of a failed env turn, naming its failure class."""
    cls = Failure.of(failure).value
    return ProtocolError("EXECUTION_ERROR", f"env step failed ({cls}): {error}", status=500,
                         failure=cls, retryable=retryable(failure), error=error,
                         episode_id=session.episode_id, session_id=session.id)


def parse_actions(data: Any, max_chars: int, max_actions: int) -> list[Any]:
    """The actions of a step message, checked: hostile input is refused, never evaluated."""
    if type(data) is dict and len(data) == 1:  # the common ``{"action": a}``, checked at once
        action = data.get("action")
        if type(action) is int or (type(action) is str and len(action) <= max_chars):
            return [action]
    if not isinstance(data, dict):
        raise ProtocolError("VALIDATION_ERROR", "step data must be an object")
    unknown = set(data) - {"action", "actions", "metadata"}
    if unknown:
        raise ProtocolError("VALIDATION_ERROR", f"unknown action fields: {sorted(unknown)[:5]}")
    if "actions" in data and data["actions"] is not None:
        actions = data["actions"]
        if not isinstance(actions, list) or not 0 < len(actions) <= max_actions:
            raise ProtocolError("VALIDATION_ERROR",
                                f"actions must be a list of 1..{max_actions} actions")
    elif "action" in data and data["action"] is not None:
        actions = [data["action"]]
    else:
        raise ProtocolError("VALIDATION_ERROR", "step data needs 'action' (or 'actions')")
    for a in actions:
        if isinstance(a, bool) or not isinstance(a, (str, int)):
            raise ProtocolError("VALIDATION_ERROR", "an action is a string or an integer")
        if isinstance(a, str) and len(a) > max_chars:
            raise ProtocolError("VALIDATION_ERROR", f"an action is at most {max_chars} chars")
    return list(actions)


__all__ = ["MAX_MESSAGE_CHARS", "Service", "failed", "parse_actions", "payload"]
