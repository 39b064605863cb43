"""The first bytes of every connection of ``turnpool serve``: `Entry`, uvicorn's ``http``
protocol class, reads the request head; a WebSocket upgrade on one of `WS_PATHS` becomes a
`turnpool.serve.ws.WsConnection`, any other request goes, with the bytes read so far, to
uvicorn's own HTTP protocol (so every HTTP route behaves exactly as without it). Also what
the upgrade paths share: `Placement` (several fronts), the size bound of a request head and
the refusal.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol, cast

import turnpool.serve.codec as codec

#: Largest request head read before the connection goes to uvicorn.
MAX_HEAD_BYTES = 65_536
#: The upgrade paths: ``/ws`` speaks OpenEnv's messages, ``/mcp`` JSON-RPC (the ``mcp``
#: verb, one session per connection, as OpenEnv's WebSocket ``/mcp``).
WS_PATHS = ("/ws", "/mcp")
FORBIDDEN = b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class Placement(Protocol):
    """Where a new ``/ws`` connection goes when the server runs several fronts
    (`turnpool.serve.fronts.link.FrontLink`); absent on a single front."""

    def place(self, session_id: str | None, hops: int) -> int | None: ...

    def pass_connection(self, transport: asyncio.Transport, data: bytes, to: int, hops: int,
                        here: Any) -> bool: ...


class Entry(asyncio.Protocol):
    """A new connection: a ``/ws`` upgrade becomes a `WsConnection`, anything else goes to
    uvicorn. uvicorn builds it as its ``http`` class (`turnpool.serve.ws.bind` makes one per
    server)."""

    ws_class: type[Any]  # `turnpool.serve.ws.WsConnection` (not imported: no cycle)
    inner_class: Any

    def __init__(self, config: Any, server_state: Any, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.config = config
        self.server_state = server_state
        self.app_state = app_state
        self.loop = _loop or asyncio.get_event_loop()
        self.transport: asyncio.Transport | None = None
        self.head = b""
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.timer = self.loop.call_later(self.config.timeout_keep_alive, transport.close)

    def data_received(self, data: bytes) -> None:
        self.head += data
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            if len(self.head) > MAX_HEAD_BYTES:
                self._hand_over(self.inner_class)
            return
        request = codec.parse_upgrade(self.head[:end])
        self._hand_over(self.ws_class if request is not None and request[0] in WS_PATHS
                        else self.inner_class)

    def _hand_over(self, protocol_class: Any) -> None:
        """Give the connection, and what it sent so far, to ``protocol_class``."""
        if self.timer is not None:
            self.timer.cancel()
        assert self.transport is not None
        inner = protocol_class(config=self.config, server_state=self.server_state,
                               app_state=self.app_state, _loop=self.loop)
        self.transport.set_protocol(inner)
        inner.connection_made(self.transport)
        head, self.head = self.head, b""
        inner.data_received(head)

    def eof_received(self) -> bool | None:
        return None  # close: a request that never ended

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()


__all__ = ["FORBIDDEN", "MAX_HEAD_BYTES", "WS_PATHS", "Entry", "Placement"]
