"""The lean ``/ws`` path of ``turnpool serve``: WebSocket sessions served straight from the
socket, in front of the ASGI app on the same host and port.

Each accepted connection starts as a `Front` protocol, which reads the request head: a
``GET /ws`` WebSocket upgrade is answered here (handshake, RFC 6455 frames, the session's
messages), and any other request is handed, with the bytes read so far, to uvicorn's own HTTP
protocol, so every HTTP route (and the ASGI ``/ws`` route, for an upgrade this front does not
take, e.g. one on a kept-alive connection) behaves exactly as without the front.

Why: under load, most of the server's CPU per step went to layers around the step, not to it:
the WebSocket protocol object, the ASGI message dicts, the coroutine and timeout machinery of
each receive/send, epoll registrations for flow control. Here a step frame costs one
``data_received`` call: the frame is unmasked, parsed (orjson), checked, and submitted to the
slot engine; the engine's driver thread batches every session's steps that arrived meanwhile
into one pool call, and its result resolves the session's future, whose callback writes the
reply frame. No task or timer per step: the server's reaper cancels a step the pool has not
answered within ``call_timeout`` (its slot is abandoned, the client gets the timeout error).

Every other message (``reset``, ``state``, ``mcp``, ``close``, invalid or oversize ones) goes
through the same handler as the ASGI route (`turnpool.serve.app.answer`), so replies are
identical. Not supported here (the client negotiates without them): permessage-deflate and
subprotocols.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import struct
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import parse_qsl

from turnpool.serve.errors import ProtocolError

if TYPE_CHECKING:
    from turnpool.serve import mcp
    from turnpool.serve.app import Link, Server, Session

log = logging.getLogger(__name__)

#: The GUID of RFC 6455's handshake (section 1.3)
_WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
#: Largest request head the front reads before handing the connection to uvicorn.
MAX_HEAD_BYTES = 65_536
#: Largest WebSocket message read (uvicorn's ``ws_max_size`` default); a longer one closes
#: the connection with 1009. Messages over `turnpool.serve.app.MAX_MESSAGE_CHARS` get the
#: usual error reply.
MAX_FRAME_BYTES = 16 * 2**20
#: Messages a client may send ahead of its replies before the server stops reading.
MAX_PENDING = 64

_apply_mask: Callable[[bytes, bytes], bytes] | None
try:  # the C unmasking of the websockets package (a dependency of the serve extra)
    from websockets.speedups import apply_mask as _apply_mask
except ImportError:  # pragma: no cover
    _apply_mask = None


def unmask(data: bytes, mask: bytes) -> bytes:
    if _apply_mask is not None:
        return _apply_mask(data, mask)
    n = len(data)
    key = int.from_bytes((mask * (n // 4 + 1))[:n], "big")
    return (int.from_bytes(data, "big") ^ key).to_bytes(n, "big")


def frame(opcode: int, payload: bytes) -> bytes:
    """One unfragmented server frame (unmasked, as RFC 6455 wants from a server)."""
    n = len(payload)
    if n < 126:
        return bytes((0x80 | opcode, n)) + payload
    if n < 65536:
        return struct.pack("!BBH", 0x80 | opcode, 126, n) + payload
    return struct.pack("!BBQ", 0x80 | opcode, 127, n) + payload


def close_frame(code: int) -> bytes:
    return frame(0x8, struct.pack("!H", code))


def accept_key(key: str) -> str:
    return base64.b64encode(hashlib.sha1(key.encode() + _WS_GUID).digest()).decode()


class Front(asyncio.Protocol):
    """A new connection: a ``/ws`` upgrade stays here, anything else goes to uvicorn.

    uvicorn builds its HTTP protocol with ``config.http_protocol_class(config=...,
    server_state=..., app_state=..., _loop=...)``; `front_protocol` makes a subclass bound to
    one server, and that subclass is given to uvicorn as its ``http`` class.
    """

    server: Server
    tools: mcp.Tools
    batcher: StepBatcher
    inner_class: Any
    #: this front's link to the others when the server runs several (None: one)
    link: Link | None = None

    def __init__(self, config: Any, server_state: Any, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.config = config
        self.server_state = server_state
        self.app_state = app_state
        self.loop = _loop or asyncio.get_event_loop()
        self.transport: asyncio.Transport | None = None
        self.head = b""
        self.timer: asyncio.TimerHandle | None = None
        #: what another front read of this connection before passing it here, and how many
        #: times it was passed (it is passed on only while this front is full)
        self.passed: bytes | None = None
        self.hops = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.timer = self.loop.call_later(self.config.timeout_keep_alive, transport.close)
        if self.passed:  # before the transport reads anything more
            self.data_received(self.passed)

    def data_received(self, data: bytes) -> None:
        self.head += data
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            if len(self.head) > MAX_HEAD_BYTES:
                self._hand_over()
            return
        request = _upgrade_request(self.head[:end])
        if request is None:
            self._hand_over()
            return
        assert self.transport is not None
        if self.link is not None:
            to = self.link.place(request[2].get("session_id"), self.hops)
            if to is not None and self.link.pass_connection(
                    self.transport, self.head, to, self.hops + 1,
                    lambda: self._serve(request, end)):
                return
        self._serve(request, end)

    def _serve(self, request: tuple[str, dict[str, str], dict[str, str]], end: int) -> None:
        """Serve the WebSocket session here."""
        assert self.transport is not None
        if self.timer is not None:
            self.timer.cancel()
        if self.transport.is_closing():
            return
        conn = WsConnection(self.server, self.tools, self.server_state, self.transport,
                            self.batcher)
        self.transport.set_protocol(conn)
        conn.start(*request, rest=self.head[end + 4:])

    def _hand_over(self) -> None:
        """Give the connection, and what it sent so far, to uvicorn's HTTP protocol."""
        if self.timer is not None:
            self.timer.cancel()
        assert self.transport is not None
        inner = self.inner_class(config=self.config, server_state=self.server_state,
                                 app_state=self.app_state, _loop=self.loop)
        self.transport.set_protocol(inner)
        inner.connection_made(self.transport)
        inner.data_received(self.head)
        self.head = b""

    def eof_received(self) -> bool | None:
        return None  # close: a request that never ended

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()


def _upgrade_request(head: bytes) -> tuple[str, dict[str, str], dict[str, str]] | None:
    """``(key, headers, query)`` of a WebSocket upgrade request for ``/ws`` that this front
    serves; None for anything else (uvicorn answers it)."""
    try:
        text = head.decode("latin-1")
        line, *lines = text.split("\r\n")
        method, target, version = line.split(" ")
    except ValueError:
        return None
    path, _, query = target.partition("?")
    if method != "GET" or path != "/ws" or version != "HTTP/1.1":
        return None
    headers: dict[str, str] = {}
    for h in lines:
        name, sep, value = h.partition(":")
        if not sep:
            return None
        headers.setdefault(name.strip().lower(), value.strip())
    if headers.get("upgrade", "").lower() != "websocket" or \
            "upgrade" not in headers.get("connection", "").lower() or \
            headers.get("sec-websocket-version") != "13" or not headers.get("sec-websocket-key"):
        return None
    return headers["sec-websocket-key"], headers, dict(parse_qsl(query, keep_blank_values=True))


class StepBatcher:
    """The steps that sessions submit within one event-loop pass, handed to the slot engine
    as one inbox item at the end of it (one hand-off per pass, not per step)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.items: list[Any] = []

    def add(self, slot: int, actions: list[Any]) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = self.engine.step_future(slot, actions, batch=self.items)
        if len(self.items) == 1:
            fut.get_loop().call_soon(self.flush)
        return fut

    def flush(self) -> None:
        items, self.items = self.items, []
        if items:
            self.engine.submit_batch(items)


class WsConnection(asyncio.Protocol):
    """One WebSocket connection = one session, served from ``data_received``."""

    def __init__(self, server: Server, tools: mcp.Tools, server_state: Any,
                 transport: asyncio.Transport, batcher: StepBatcher) -> None:
        self.batcher = batcher
        self.server = server
        self.tools = tools
        self.server_state = server_state
        self.transport = transport
        self.loop = asyncio.get_event_loop()
        self.buf = b""
        self.parts: list[bytes] = []  # a fragmented message so far
        self.part_opcode = 0
        self.pending: deque[str] = deque()
        self.running = False  # a message of this session is being answered
        self.open = False  # the handshake is done and no close was sent
        self.lost = False
        self.paused = False
        self.session: Session | None = None
        self.attached = False  # a session someone else opened (theirs to close)
        self.began = 0.0

    # ------------------------------------------------------------------ handshake
    def start(self, key: str, headers: dict[str, str], query: dict[str, str],
              rest: bytes) -> None:
        server = self.server
        if not server.authorized(headers, query):
            self.transport.write(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n"
                                 b"connection: close\r\n\r\n")
            self.transport.close()
            return
        self.transport.write(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                              f"Connection: Upgrade\r\nSec-WebSocket-Accept: {accept_key(key)}"
                              "\r\n\r\n").encode())
        self.open = True
        self.server_state.connections.add(self)
        wanted = query.get("session_id")
        try:
            session = server.attach(wanted) if wanted else server.open("ws")
        except ProtocolError as exc:
            from turnpool.serve.app import dumps

            self.send(dumps({"type": "error", "data": exc.data()}))
            self.end(1013 if exc.code == "CAPACITY_REACHED" else 1008)
            return
        self.attached = bool(wanted)
        self.session = session
        session.websocket = self
        if rest:
            self.data_received(rest)

    # ------------------------------------------------------------------ frames in
    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        i, n = 0, len(buf)
        while self.open and n - i >= 2:
            b0, b1 = buf[i], buf[i + 1]
            length, at = b1 & 0x7F, i + 2
            if length == 126:
                if n - at < 2:
                    break
                length, at = int.from_bytes(buf[at:at + 2], "big"), at + 2
            elif length == 127:
                if n - at < 8:
                    break
                length, at = int.from_bytes(buf[at:at + 8], "big"), at + 8
            if not b1 & 0x80 or b0 & 0x70:  # unmasked client frame, or reserved bits set
                self.end(1002)
                return
            if length > MAX_FRAME_BYTES:
                self.end(1009)
                return
            if n - at < 4 + length:
                break
            payload = unmask(buf[at + 4:at + 4 + length], buf[at:at + 4])
            i = at + 4 + length
            self._frame(b0 & 0x80, b0 & 0x0F, payload)
        self.buf = buf[i:] if i < n else b""

    def _frame(self, fin: int, opcode: int, payload: bytes) -> None:
        if opcode >= 0x8:  # control frames
            if opcode == 0x8:
                self.end(1000)
            elif opcode == 0x9:
                self.transport.write(frame(0xA, payload))
            return
        if opcode == 0x0:
            if not self.parts:
                self.end(1002)
                return
            self.parts.append(payload)
            if sum(map(len, self.parts)) > MAX_FRAME_BYTES:
                self.end(1009)
                return
            if not fin:
                return
            payload, opcode, self.parts = b"".join(self.parts), self.part_opcode, []
        elif self.parts:
            self.end(1002)
            return
        elif not fin:
            self.parts, self.part_opcode = [payload], opcode
            return
        if opcode == 0x1:
            try:
                text = payload.decode("utf-8")
            except UnicodeDecodeError:
                self.end(1007)
                return
        elif opcode == 0x2:
            text = payload.decode("utf-8", "replace")
        else:
            self.end(1002)
            return
        self.pending.append(text)
        if len(self.pending) > MAX_PENDING and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        if not self.running:
            self._next()

    # ------------------------------------------------------------------ messages
    def _next(self) -> None:
        """Start answering the next message waiting, if any (one at a time, in order)."""
        session = self.session
        while self.pending and self.open and session is not None and not session.closed:
            raw = self.pending.popleft()
            if self.paused and len(self.pending) <= MAX_PENDING // 2:
                self.paused = False
                self.transport.resume_reading()
            self.running = True
            if self._step(session, raw):
                return
            task = self.loop.create_task(self._answer(session, raw))
            task.add_done_callback(self._answered)
            return
        self.running = False

    def _step(self, session: Session, raw: str) -> bool:
        """Submit ``raw`` to the slot engine if it is a well-formed step message (True);
        False for anything else, which `_answer` handles."""
        from turnpool.serve.app import MAX_MESSAGE_CHARS, dumps, loads

        if len(raw) > MAX_MESSAGE_CHARS or loads is None:
            return False
        try:
            msg = loads(raw)
        except ValueError:
            return False
        if not isinstance(msg, dict) or msg.get("type") != "step" or session.busy:
            return False
        server = self.server
        try:
            actions = server.step_actions(session, msg.get("data"))
            fut = self.batcher.add(session.slot, actions)
        except ProtocolError as exc:
            self._reply(dumps({"type": "error", "data": exc.data()}))
            return True
        except (RuntimeError, ValueError):  # the pool is closing: the slow path says so
            return False
        session.busy = True
        session.inflight = fut
        session.deadline = time.monotonic() + server.settings.call_timeout_s()
        self.began = time.perf_counter()
        fut.add_done_callback(self._stepped)
        return True

    def _stepped(self, fut: asyncio.Future[Any]) -> None:
        from turnpool.serve.app import dumps, dumps_bytes

        session = self.session
        assert session is not None
        server = self.server
        session.busy = False
        session.inflight = None
        session.last_active = time.monotonic()
        try:
            if fut.cancelled():  # the reaper: no answer within call_timeout
                server.engine.abandon(session.slot)
                raise server.timed_out(session, RuntimeError(
                    f"the pool did not answer within {server.settings.call_timeout_s():g} s"))
            exc = fut.exception()
            if exc is not None:
                raise ProtocolError("EXECUTION_ERROR", str(exc), status=503)
            payload = server.stepped(session, fut.result(), self.began)
        except ProtocolError as err:
            self._reply(dumps({"type": "error", "data": err.data()}))
            return
        if self.open:
            self.transport.write(frame(0x1, dumps_bytes({"type": "observation",
                                                          "data": payload})))
        self._done()

    async def _answer(self, session: Session, raw: str) -> str | None:
        from turnpool.serve.app import answer

        return await answer(self.server, self.tools, session, raw)

    def _answered(self, task: asyncio.Task[str | None]) -> None:
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

    def _reply(self, text: str) -> None:
        self.send(text)
        self._done()

    def _done(self) -> None:
        """A message answered: end the connection if its session closed meanwhile (or the
        client left), else go on with the next message."""
        self.running = False
        session = self.session
        if self.lost or not self.open or (session is not None and session.closed):
            self.end(1000)
            return
        self._next()

    # ------------------------------------------------------------------ frames out
    def send(self, text: str) -> None:
        if self.open:
            self.transport.write(frame(0x1, text.encode()))

    def end(self, code: int = 1000) -> None:
        """Send a close frame (once) and end the connection."""
        if self.open:
            self.open = False
            self.transport.write(close_frame(code))
        if not self.running:
            self._release()
        self.transport.close()

    def _release(self) -> None:
        session = self.session
        if session is None:
            return
        if session.websocket is self:
            session.websocket = None
        if not self.attached:
            self.server.close(session)

    async def send_text(self, data: str) -> None:  # `turnpool.serve.app.Peer`
        self.send(data)

    async def close(self, code: int = 1000) -> None:  # `turnpool.serve.app.Peer`
        self.end(code)

    def shutdown(self) -> None:  # uvicorn's graceful shutdown
        self.end(1012)

    # ------------------------------------------------------------------ flow control
    def pause_writing(self) -> None:
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        if not self.paused:
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.open = False
        self.server_state.connections.discard(self)
        if not self.running:
            self._release()


def front_protocol(server: Server, tools: mcp.Tools, inner_class: Any,
                   link: Link | None = None) -> type[Front]:
    """The `Front` class of one server, to give uvicorn as ``http``; ``inner_class`` is
    uvicorn's HTTP protocol class that serves every other request; ``link`` places new
    sessions among several fronts."""
    return type("TurnpoolFront", (Front,), {"server": server, "tools": tools,
                                            "batcher": StepBatcher(server.engine),
                                            "inner_class": inner_class, "link": link})


__all__ = ["Front", "WsConnection", "front_protocol"]
