"""The session table of ``turnpool serve``: the one owner of every session change (open,
attach, close, timeout) and of the one timer that ends what waited too long.

A session holds one env slot of the engine from its open to its close. Kinds: ``ws`` (a
WebSocket connection's own), ``http`` / ``mcp`` (held over requests with no connection to end
them: capped, and closed after ``http_session_timeout`` idle seconds) and ``once`` (one call,
closed by its caller). `SessionTable.sweep` runs every `SessionTable.period` seconds and
applies both limits there is: a call the pool has not answered within ``call_timeout`` fails
with `PoolTimeout` (its slot is abandoned), and a session idle past its limit is closed (its
WebSocket, if any, told).

Example:
    >>> from turnpool.serve.engine import ServeSettings
    >>> class Slots:  # what the table needs of a slot engine
    ...     capacity = 1
    ...     def lease(self, near=None): return 0
    ...     def release(self, slot): pass
    ...     def abandon(self, slot): pass
    >>> table = SessionTable(Slots(), ServeSettings(http_session_timeout=5.0))
    >>> s = table.open("http")
    >>> table.get(s.id) is s, len(table)
    (True, 1)
    >>> [x.id for x in table.sweep(now=s.last_active + 6.0)] == [s.id], len(table)
    (True, 0)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from turnpool.pool.slot_requests import LoopWaiter
from turnpool.pool.slots import PoolFull, PoolTimeout
from turnpool.serve.engine import ServeSettings
from turnpool.serve.errors import ProtocolError
from turnpool.serve.journal import Journal, NullJournal

#: Session kinds held across requests with no connection to end them (capped, reaped).
HELD_KINDS = ("http", "mcp")


class Peer(Protocol):
    """What the table needs of a WebSocket connection holding a session."""

    def send(self, text: str) -> None: ...

    def end(self, code: int = 1000) -> None: ...


class Slots(Protocol):
    """What the table needs of the slot engine."""

    @property
    def capacity(self) -> int: ...

    def lease(self, near: int | None = None) -> int: ...

    def release(self, slot: int) -> None: ...

    def abandon(self, slot: int) -> None: ...


@dataclass(slots=True)  # the step path reads and writes several fields per message
class Session:
    id: str
    slot: int
    kind: str  # "ws", "http" / "mcp" (held over requests) or "once" (one call)
    created: float = field(default_factory=time.time)
    last_active: float = field(default_factory=time.monotonic)
    episode_id: str | None = None
    seed: int | None = None
    step_count: int = 0
    started: bool = False
    done: bool = False
    failures: int = 0
    closed: bool = False
    #: the WebSocket connection holding the session (None: none now)
    websocket: Peer | None = None
    #: the call in flight (None: none), and the monotonic time after which it times out
    inflight: asyncio.Future[Any] | LoopWaiter | None = None
    deadline: float = 0.0
    #: the actions of the last step asked (the journal records them once answered)
    actions: list[Any] = field(default_factory=list)
    #: brought back by a restarted server (`SessionTable.resume`)
    resumed: bool = False

    @property
    def busy(self) -> bool:
        return self.inflight is not None


class SessionTable:
    """Every open session, by id; ``on_change`` is called when one opens or closes."""

    def __init__(self, slots: Slots, settings: ServeSettings, id_prefix: str = "",
                 on_change: Callable[[], None] | None = None) -> None:
        self.slots = slots
        self.settings = settings
        #: what new session ids start with (``f<k>-`` on front k of several)
        self.id_prefix = id_prefix
        self.on_change = on_change
        self._sessions: dict[str, Session] = {}
        self.refused = 0
        self.reaped = 0
        #: where each session's changes are recorded (`turnpool.serve.journal`; a
        #: `FileJournal` with ``--state-dir``)
        self.journal: Journal = NullJournal()
        self._call_timeout = settings.call_timeout_s()

    def __len__(self) -> int:
        return len(self._sessions)

    def __iter__(self) -> Iterator[Session]:
        return iter(list(self._sessions.values()))

    def get(self, session_id: Any) -> Session | None:
        return self._sessions.get(session_id) if isinstance(session_id, str) else None

    # ------------------------------------------------------------------ changes
    def open(self, kind: str, peer: Peer | None = None, near: Session | None = None
             ) -> Session:
        """A new session of ``kind`` (held by the WebSocket ``peer``, if given; ``near``: a
        fork's source, whose worker its slot prefers, `SlotEngine.lease`);
        ``CAPACITY_REACHED`` when its cap or the slots are used up."""
        if kind in HELD_KINDS:
            held = sum(1 for s in self._sessions.values() if s.kind in HELD_KINDS)
            cap = self.settings.http_cap()
            if held >= cap:
                self.refused += 1
                raise ProtocolError("CAPACITY_REACHED",
                                    f"all {cap} sessions held over HTTP/MCP are in use "
                                    "(max_http_sessions); close one, or use a WebSocket",
                                    status=503, max_http_sessions=cap)
        try:
            slot = self.slots.lease(near.slot if near is not None else None)
        except PoolFull:
            self.refused += 1
            cap = self.slots.capacity
            raise ProtocolError("CAPACITY_REACHED",
                                f"server busy: all {cap} env slots are held by sessions; "
                                "retry after one closes", status=503,
                                active_sessions=len(self._sessions), max_sessions=cap) from None
        session = Session(self.id_prefix + uuid.uuid4().hex, slot, kind, websocket=peer)
        if kind != "once":
            try:
                self.journal.opened(session.id, kind)
            except ProtocolError:  # it cannot be recorded: not opened
                self.slots.release(slot)
                raise
        self._sessions[session.id] = session
        self._changed()
        return session

    def resume(self, session_id: str, kind: str) -> Session:
        """The session ``session_id`` of ``kind`` again, on a free slot, held by no one
        (a restarted server's, `turnpool.serve.resume`; not recorded: the journal has it);
        `PoolFull` when no slot is free."""
        session = Session(session_id, self.slots.lease(), kind, resumed=True)
        self._sessions[session_id] = session
        self._changed()
        return session

    def attach(self, session_id: str, peer: Peer) -> Session:
        """Give the session ``session_id`` (one an MCP or HTTP client opened) to the
        WebSocket ``peer``; ``SESSION_ERROR`` when there is none, or it has one already."""
        session = self._sessions.get(session_id)
        if session is None:
            raise ProtocolError("SESSION_ERROR", f"Unknown session_id: {session_id}")
        if session.websocket is not None:
            raise ProtocolError("SESSION_ERROR",
                                f"Session {session_id} already has an attached WebSocket")
        session.websocket = peer
        session.last_active = time.monotonic()
        return session

    def detach(self, session: Session, peer: Peer) -> None:
        """``peer`` lets go of ``session``: a WebSocket session (one resumed after a restart
        too) ends with its connection; a session held over HTTP/MCP stays."""
        if session.websocket is peer:
            session.websocket = None
            if session.kind == "ws":
                self.close(session)

    def close(self, session: Session) -> None:
        """End ``session`` and release its slot (idempotent)."""
        if session.closed:
            return
        session.closed = True
        self._sessions.pop(session.id, None)
        self.slots.release(session.slot)
        self.journal.closed(session.id)
        self._changed()

    def close_all(self) -> None:
        for session in self:
            self.close(session)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    # ------------------------------------------------------------------ calls
    def begin_call(self, session: Session, fut: asyncio.Future[Any] | LoopWaiter) -> None:
        """``fut`` is ``session``'s call in flight until it resolves (`end_call`)."""
        session.inflight = fut
        session.deadline = time.monotonic() + self._call_timeout

    def end_call(self, session: Session) -> None:
        session.inflight = None
        session.last_active = time.monotonic()

    # ------------------------------------------------------------------ the one timer
    def idle_limit(self, session: Session) -> float | None:
        """Seconds ``session`` may stay idle (None: forever): a session a WebSocket holds
        lives with its connection unless ``session_timeout`` is set; one held over HTTP/MCP,
        and a WebSocket session resumed after a restart while its client has not come back,
        has ``http_session_timeout``."""
        if session.websocket is None and (session.kind in HELD_KINDS or session.resumed):
            return self.settings.http_session_timeout
        return self.settings.session_timeout

    @property
    def period(self) -> float:
        """Seconds between two sweeps: a quarter of the shortest limit, within 0.2 .. 1."""
        limits = [t for t in (self.settings.session_timeout,
                              self.settings.http_session_timeout) if t is not None]
        return max(0.2, min([1.0, self.settings.call_timeout_s() / 4,
                             *(t / 4 for t in limits)]))

    def sweep(self, now: float | None = None) -> list[Session]:
        """Fail the calls past their deadline, close the sessions idle past their limit
        (telling their WebSocket); the sessions closed."""
        now = time.monotonic() if now is None else now
        closed = []
        for session in self:
            fut = session.inflight
            if fut is not None and now > session.deadline and not fut.done():
                self.slots.abandon(session.slot)  # its env may still be running
                fut.set_exception(PoolTimeout(
                    f"the pool did not answer within {self.settings.call_timeout_s():g} s"))
            limit = self.idle_limit(session)
            if limit is not None and not session.busy and now - session.last_active > limit:
                self.reaped += 1
                self.close(session)
                closed.append(session)
                if session.websocket is not None:
                    self._tell_idle(session.websocket, limit)
        return closed

    @staticmethod
    def _tell_idle(peer: Peer, limit: float) -> None:
        from turnpool.serve.jsonio import error_frame

        with contextlib.suppress(Exception):
            peer.send(error_frame("SESSION_ERROR", f"session closed after {limit:g} s idle"))
            peer.end(1000)

    async def sweep_forever(self, tick: Callable[[float], None] | None = None) -> None:
        """`sweep` every `period` seconds (``tick(now)`` first: the step-rate sampler)."""
        while True:
            await asyncio.sleep(self.period)
            now = time.monotonic()
            if tick is not None:
                tick(now)
            self.sweep(now)


__all__ = ["HELD_KINDS", "Peer", "Session", "SessionTable"]
