"""The one ``/ws`` path of ``turnpool serve``: WebSocket sessions served straight from the
socket, beside the ASGI app on the same host and port.

Each accepted connection starts as an `Entry` protocol (uvicorn's ``http`` class,
`turnpool.serve.entry`), which reads the request head: a ``GET /ws`` WebSocket upgrade
becomes a `WsConnection`, and any other request is handed, with the bytes read so far, to
uvicorn's own HTTP protocol, so every HTTP route behaves exactly as without it. An upgrade
that uvicorn parses itself (one on a kept-alive connection, after an HTTP request) reaches the
same `WsConnection`: it is also uvicorn's ``ws`` class. The ASGI app has no ``/ws`` route.

Why: under load, most of the server's CPU per step went to layers around the step, not to it:
the WebSocket protocol object, the ASGI message dicts, the coroutine and timeout machinery of
each receive/send, epoll registrations for flow control. Here a step frame costs one
``data_received`` call: the frame is unmasked (`turnpool.serve.codec`), its bytes parsed
once (orjson), checked, and submitted to the slot engine; the engine's driver thread batches
every session's steps that arrived meanwhile into one pool call, and its round hands the
result to the step's `StepCall`, which writes the reply frame (JSON bytes, no str between).
No task, future or timer per step: the session table's sweep fails a step the pool has not
answered within ``call_timeout`` (`turnpool.serve.sessions`).

Every other message (``reset``, ``state``, ``mcp``, ``close``, turnpool's ``fork``,
``snapshot`` and ``restore``, invalid or oversize ones) goes through `answer` (parsed
already, unless orjson could not read it), which finds
its verb in the served-verb table (`turnpool.serve.verbs`) as HTTP and MCP do. Both paths
of a step share `Service.begin_step` / `Service.finish_step`. A WebSocket on ``/mcp`` (OpenEnv's
JSON-RPC socket) is a `WsConnection` too, with its own session, whose every message is the
``mcp`` verb's (`turnpool.serve.verbs.rpc`); a ``step`` whose action has a ``type`` (OpenEnv's
MCP actions) leaves the fast path for `answer`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from typing import Any, cast

import turnpool.serve.codec as codec
import turnpool.serve.mcp as mcp
from turnpool.pool.slots import ResetSlotRequest, StepSlotRequest
from turnpool.serve.entry import FORBIDDEN, MAX_HEAD_BYTES, WS_PATHS, Entry, Placement
from turnpool.serve.errors import ProtocolError
from turnpool.serve.jsonio import MAX_MESSAGE_CHARS, dumps_bytes, loads
from turnpool.serve.service import Service
from turnpool.serve.sessions import Session
from turnpool.serve.verbs import BY_NAME, rpc
from turnpool.serve.ws_calls import ResetCall, StepBatcher, StepCall

log = logging.getLogger(__name__)

#: Largest WebSocket message read (uvicorn's ``ws_max_size`` default); a longer one closes
#: the connection with 1009. Messages over `MAX_MESSAGE_CHARS` get the usual error reply.
MAX_FRAME_BYTES = 16 * 2**20
#: Messages a client may send ahead of its replies before the server stops reading.
MAX_PENDING = 64


async def answer(service: Service, session: Session, raw: str | None, msg: Any = None
                 ) -> bytes | None:
    """The reply frame's payload to one WebSocket message: its verb's
    (`turnpool.serve.verbs`) reply of the handler's value, or an ``error``; None: the message
    ends the connection. ``msg``: the message as parsed already (``raw`` None), else ``raw``
    is its text, parsed here."""
    try:
        if raw is not None:
            if len(raw) > MAX_MESSAGE_CHARS:
                raise ProtocolError("VALIDATION_ERROR", "message too large")
            try:
                msg = json.loads(raw)
            except ValueError as exc:
                raise ProtocolError("INVALID_JSON", f"Invalid JSON: {exc}") from exc
        kind = msg.get("type") if isinstance(msg, dict) else None
        verb = BY_NAME.get(kind) if isinstance(kind, str) else None
        if verb is None:
            raise ProtocolError("UNKNOWN_TYPE", f"Unknown message type: {kind}")
        if verb.reply is None:
            return None
        out = await verb.run(service, session, verb.parse(msg.get("data")))
        return dumps_bytes({"type": verb.reply, "data": out})
    except ProtocolError as exc:
        return _error(exc)


def _error(exc: ProtocolError) -> bytes:
    return dumps_bytes({"type": "error", "data": exc.data()})


async def _rpc_text(service: Service, session: Session, raw: str) -> bytes | None:
    """The reply frame's payload to one message of a WebSocket on ``/mcp``: its JSON-RPC
    response."""
    return dumps_bytes(await rpc(service, session, raw))


class WsConnection(asyncio.Protocol):
    """One WebSocket connection = one session, served from ``data_received``: first the
    upgrade request's head, then frames."""

    # slots: the step path reads a dozen of these per message, for ~1,000 connections
    __slots__ = ("attached", "began", "episode_id", "frames", "head", "hops", "loop", "lost",
                 "messages", "open", "passed", "paused", "pending", "rpc", "running",
                 "server_state", "session", "transport")

    #: set per server on the subclass `bind` makes
    service: Service
    batcher: StepBatcher
    placement: Placement | None = None

    def __init__(self, config: Any, server_state: Any, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.server_state = server_state
        self.loop = _loop or asyncio.get_event_loop()
        self.transport: asyncio.Transport | None = None
        self.head: bytes | None = b""  # None once the handshake is read
        #: how many times another front passed this connection on (`Placement`), and what
        #: the last one read of it
        self.hops = 0
        self.passed = b""
        self.frames = codec.FrameDecoder(MAX_FRAME_BYTES)
        self.messages = codec.MessageAssembler(MAX_FRAME_BYTES)
        #: messages waiting for the one being answered: (parsed, None), or (None, text)
        #: for `answer` to parse
        self.pending: deque[tuple[Any, str | None]] = deque()
        self.running = False  # a message of this session is being answered
        self.open = False  # the handshake is done and no close was sent
        self.lost = False
        self.paused = False
        self.session: Session | None = None
        self.attached = False  # a session someone else opened (theirs to close)
        self.began = 0.0
        self.episode_id: Any = None  # of the reset in flight
        self.rpc = False  # a WebSocket on /mcp: each message is a JSON-RPC request

    # ------------------------------------------------------------------ handshake
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        if self.passed:  # before the transport reads anything more
            self.data_received(self.passed)

    def _handshake(self, data: bytes) -> None:
        assert self.head is not None and self.transport is not None
        self.head += data
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            if len(self.head) > MAX_HEAD_BYTES:
                self.transport.close()
            return
        request = codec.parse_upgrade(self.head[:end])
        if request is None or request[0] not in WS_PATHS:
            self.head = None
            self.transport.write(FORBIDDEN)
            self.transport.close()
            return
        self.rpc = request[0] == "/mcp"
        if self.placement is not None:
            wanted = None if self.rpc else request[3].get("session_id")
            to = self.placement.place(wanted, self.hops)
            if to is not None and self.placement.pass_connection(
                    self.transport, self.head, to, self.hops + 1,
                    lambda: self._start(request, end)):
                return
        self._start(request, end)

    def _start(self, request: codec.UpgradeRequest, end: int) -> None:
        """Answer the handshake and open (or attach) the session."""
        assert self.head is not None and self.transport is not None
        rest, self.head = self.head[end + 4:], None
        if self.transport.is_closing():
            return
        _, key, headers, query = request
        service = self.service
        if not service.authorized(headers, query):
            self.transport.write(FORBIDDEN)
            self.transport.close()
            return
        self.transport.write(codec.accept_response(key))
        self.open = True
        self.server_state.connections.add(self)
        wanted = None if self.rpc else query.get("session_id")
        try:
            session = service.sessions.attach(wanted, self) if wanted else \
                service.sessions.open("ws", self)
        except ProtocolError as exc:  # on /mcp the refusal is a JSON-RPC error too
            self.send_bytes(dumps_bytes(
                mcp.rpc_error(mcp.SERVER_ERROR, exc.message, data=exc.data())
                if self.rpc else {"type": "error", "data": exc.data()}))
            self.end(1013 if exc.code == "CAPACITY_REACHED" else 1008)
            return
        self.attached = bool(wanted)
        self.session = session
        if rest:
            self.data_received(rest)

    # ------------------------------------------------------------------ frames in
    def data_received(self, data: bytes) -> None:
        if self.head is not None:
            self._handshake(data)
            return
        if not self.open:
            return
        try:
            messages = self.messages
            for fin, opcode, payload in self.frames.feed(data):
                # a whole text frame with no fragments pending is its message (no call)
                if fin and opcode == codec.OP_TEXT and not messages.parts:
                    self._message(opcode, payload)
                else:
                    message = messages.add(fin, opcode, payload)
                    if message is not None:
                        self._message(*message)
                if not self.open:
                    return
        except codec.FrameError as exc:
            self.end(exc.code)

    def _message(self, opcode: int, payload: bytes) -> None:
        if opcode >= codec.OP_CLOSE:  # a control frame
            if opcode == codec.OP_CLOSE:
                self.end(1000)
            elif opcode == codec.OP_PING:
                self._write(codec.encode_frame(codec.OP_PONG, payload))
            elif opcode != codec.OP_PONG:  # a reserved one
                raise codec.FrameError(1002)
            return
        item = self._read(opcode, payload)
        if not self.running and not self.pending:  # the common case: nothing to queue behind
            self._begin(item)
            return
        self.pending.append(item)
        if len(self.pending) > MAX_PENDING and not self.paused:
            self.paused = True
            self._transport().pause_reading()

    def _read(self, opcode: int, payload: bytes) -> tuple[Any, str | None]:
        """A data message parsed once, by orjson from the frame's bytes: ``(message, None)``;
        ``(None, text)`` for one it cannot read (NaN, huge ints, broken JSON, a binary
        frame, an oversize one) and for any on ``/mcp``: `answer` (or JSON-RPC) parses that
        text with json and says what is wrong. `codec.FrameError` for text that is not
        UTF-8."""
        if opcode == codec.OP_TEXT and not self.rpc and loads is not None and \
                len(payload) <= MAX_MESSAGE_CHARS:
            try:
                return loads(payload), None
            except ValueError:  # not UTF-8 either: message_text closes with 1007
                pass
        return None, codec.message_text(opcode, payload)

    # ------------------------------------------------------------------ messages
    def _next(self) -> None:
        """Start answering the next message waiting, if any (one at a time, in order)."""
        self.running = False
        if not self.pending:
            return
        item = self.pending.popleft()
        if self.paused and len(self.pending) <= MAX_PENDING // 2:
            self.paused = False
            self._transport().resume_reading()
        self._begin(item)

    def _begin(self, item: tuple[Any, str | None]) -> None:
        session = self.session
        if not self.open or session is None or session.closed:
            self.pending.appendleft(item)  # the connection is ending: left unanswered
            return
        self.running = True
        msg, text = item
        if self.rpc:
            assert text is not None
            task = self.loop.create_task(_rpc_text(self.service, session, text))
        elif text is None and isinstance(msg, dict) and (
                self._step(session, msg) or self._reset(session, msg)):
            return
        else:
            task = self.loop.create_task(answer(self.service, session, text, msg))
        task.add_done_callback(self._answered)

    def _step(self, session: Session, msg: dict[str, Any]) -> bool:
        """Submit the step message ``msg`` to the slot engine's batcher (True); False for
        any other message, which `answer` handles. The step itself is the general path's:
        `Service.begin_step` before, `Service.finish_step` after (`stepped`)."""
        if msg.get("type") != "step":
            return False
        data = msg.get("data")
        if isinstance(data, dict) and "type" in data:  # an MCP action: `answer` runs it
            return False
        service = self.service
        try:
            actions = service.begin_step(session, data)
            call = StepCall(self)
            service.submit(session, lambda: self.batcher.add(
                StepSlotRequest(session.slot, actions, call), call))
        except ProtocolError as exc:
            self._reply(_error(exc))
            return True
        self.began = time.perf_counter()
        return True

    def _reset(self, session: Session, msg: dict[str, Any]) -> bool:
        """A reset message goes to the batcher as a step does (True; False for any other):
        `Service.begin_reset` before, `Service.finish_reset` after (`was_reset`)."""
        if msg.get("type") != "reset":
            return False
        service, verb = self.service, BY_NAME["reset"]
        try:
            seed, self.episode_id = service.begin_reset(session, verb.parse(msg.get("data")))
            call = ResetCall(self)
            service.submit(session, lambda: self.batcher.add(
                ResetSlotRequest(session.slot, seed, call), call))
        except ProtocolError as exc:
            self._reply(_error(exc))
        return True

    def was_reset(self, result: Any, exc: BaseException | None) -> None:
        """The slot engine's answer to this connection's reset (`StepCall`): the reply."""
        self.stepped(result, exc, self.service.finish_reset, self.episode_id)

    def stepped(self, result: Any, exc: BaseException | None, finish: Any = None,
                extra: Any = None) -> None:
        """The slot engine's answer to this connection's step (`StepCall`): the reply; the
        reset's with ``finish`` = `Service.finish_reset` and its episode id."""
        session = self.session
        assert session is not None
        try:
            payload = self.service.finish_step(session, result, exc, self.began) \
                if finish is None else finish(session, result, exc, extra)
        except ProtocolError as err:
            self._reply(_error(err))
            return
        except Exception:  # a bug must not stop the driver's other deliveries
            log.exception("a WebSocket step failed")
            self.running = False
            self.end(1011)
            return
        transport = self.transport
        if self.open and transport is not None:  # `_reply` without its calls: once per step
            transport.write(codec.encode_frame(
                codec.OP_TEXT, dumps_bytes({"type": "observation", "data": payload})))
        self._done()

    def _answered(self, task: asyncio.Task[bytes | None]) -> None:
        exc = None if task.cancelled() else task.exception()
        if task.cancelled() or exc is not None:
            if exc is not None:
                log.error("a WebSocket message failed", exc_info=exc)
            self.running = False
            self.end(1011)
            return
        reply = task.result()
        if reply is None:  # the client closed the session
            self.running = False
            self.end(1000)
            return
        self._reply(reply)

    def _reply(self, data: bytes) -> None:
        self.send_bytes(data)
        self._done()

    def _done(self) -> None:
        """A message answered: end the connection if its session closed meanwhile (or the
        client left), else go on with the next message."""
        session = self.session
        if self.lost or not self.open or (session is not None and session.closed):
            self.running = False
            self.end(1000)
            return
        self._next()

    # ------------------------------------------------------------------ frames out
    def _transport(self) -> asyncio.Transport:
        assert self.transport is not None
        return self.transport

    def _write(self, data: bytes) -> None:
        self._transport().write(data)

    def send(self, text: str) -> None:  # `turnpool.serve.sessions.Peer`
        self.send_bytes(text.encode())

    def send_bytes(self, data: bytes) -> None:
        """A text frame of ``data`` (UTF-8 already), if the connection is open."""
        if self.open:
            self._transport().write(codec.encode_frame(codec.OP_TEXT, data))

    def end(self, code: int = 1000) -> None:  # `turnpool.serve.sessions.Peer`
        """Send a close frame (once) and end the connection."""
        if self.open:
            self.open = False
            self._write(codec.close_frame(code))
        if not self.running:
            self._release()
        self._transport().close()

    def _release(self) -> None:
        session = self.session
        if session is None:
            return
        table = self.service.sessions
        table.detach(session, self)
        if not self.attached:
            table.close(session)

    def shutdown(self) -> None:  # uvicorn's graceful shutdown
        self.end(1012)

    # ------------------------------------------------------------------ flow control
    def pause_writing(self) -> None:
        self._transport().pause_reading()

    def resume_writing(self) -> None:
        if not self.paused:
            self._transport().resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.open = False
        self.server_state.connections.discard(self)
        if not self.running:
            self._release()


def bind(service: Service, inner_class: Any, placement: Placement | None = None
         ) -> tuple[type[Entry], type[WsConnection]]:
    """The `Entry` and `WsConnection` classes of one server, to give uvicorn as ``http``
    and ``ws``; ``inner_class`` is uvicorn's HTTP protocol class that serves every other
    request; ``placement`` places new sessions among several fronts."""
    ws = type("TurnpoolWs", (WsConnection,), {"__slots__": (), "service": service,
                                              "batcher": StepBatcher(service),
                                              "placement": placement})
    entry = type("TurnpoolEntry", (Entry,), {"ws_class": ws, "inner_class": inner_class})
    return entry, ws


def adopt(ws_class: type[WsConnection], server_state: Any, data: bytes, hops: int
          ) -> WsConnection:
    """A `WsConnection` for a connection another front passed here: ``data`` (what that
    front read of it) is read once the transport is made."""
    conn = ws_class(config=None, server_state=server_state, app_state={})
    conn.hops, conn.passed = hops, data
    return conn


__all__ = ["WS_PATHS", "Entry", "MAX_FRAME_BYTES", "Placement", "ResetCall", "StepBatcher",
           "StepCall", "WsConnection", "adopt", "answer", "bind"]
