"""Passing a connection from one front process to another: the socket's descriptor and the
bytes read from it so far, over a Unix datagram socket (``SCM_RIGHTS``). The receiver serves
it as if it had accepted it (``adopt``, given by whoever runs the server).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

#: Largest message passed with a connection (the request head and what followed it).
MAX_PASSED_BYTES = 256 * 1024
#: Seconds a pass may wait for a full queue before the connection is served where it is.
PASS_WAIT_S = 1.0

#: ``adopt(data, hops)``: the protocol to serve a passed connection with (``data`` read
#: first, ``hops`` passes so far)
Adopt = Callable[[bytes, int], asyncio.Protocol]


class SocketPasser:
    """This front's datagram socket at ``own_path``; `pass_connection` sends to the path
    ``path_of(k)`` of front ``k``; connections received are served with ``adopt``."""

    def __init__(self, own_path: str, path_of: Callable[[int], str]) -> None:
        self.own_path = own_path
        self.path_of = path_of
        self.adopt: Adopt | None = None
        self._sock: socket.socket | None = None
        #: passes waiting for a full queue: (transport, data, to, hops, deadline, here)
        self._waiting: deque[tuple[Any, bytes, int, int, float, Callable[[], None]]] = deque()
        self._retry: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        #: connections passed to / taken from other fronts
        self.passed_out = self.passed_in = 0

    def start(self) -> None:
        """Bind and begin receiving (on the running loop)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.own_path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * MAX_PASSED_BYTES)
        sock.bind(self.own_path)
        self._sock = sock
        asyncio.get_running_loop().add_reader(sock.fileno(), self._receive)

    def stop(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._sock is not None:
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None

    def pass_connection(self, transport: asyncio.Transport, data: bytes, to: int,
                        hops: int = 1, here: Callable[[], None] | None = None) -> bool:
        """Hand ``transport``'s connection, with the bytes read from it so far, to front
        ``to`` (its ``hops``-th pass); False (serve it here) if that cannot be done now.
        When ``to``'s queue is full (a burst: Linux queues 10 datagrams per socket by
        default) and ``here`` is given, the pass waits with the connection paused, retried
        each millisecond for up to `PASS_WAIT_S`, after which ``here()`` serves it on this
        front; True then too."""
        if transport.get_extra_info("socket") is None or self._sock is None or \
                len(data) > MAX_PASSED_BYTES:
            return False
        if not self._waiting:
            sent = self._send(transport, data, to, hops)
            if sent is not None:
                return sent
        if here is None:
            return False
        transport.pause_reading()
        self._waiting.append((transport, data, to, hops, time.monotonic() + PASS_WAIT_S, here))
        if self._retry is None:
            self._retry = asyncio.get_running_loop().call_later(0.001, self._flush)
        return True

    def _send(self, transport: asyncio.Transport, data: bytes, to: int, hops: int
              ) -> bool | None:
        """One try: True if passed, False if it cannot be, None if ``to``'s queue is full."""
        assert self._sock is not None
        sock = transport.get_extra_info("socket")
        try:
            # sendmsg itself: socket.send_fds drops its address argument
            self._sock.sendmsg([bytes((hops,)), data], [(
                socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [sock.fileno()]))], 0,
                self.path_of(to))
        except BlockingIOError:
            return None
        except OSError as exc:  # it is restarting, or the client left
            log.debug("could not pass a connection to front %d: %s", to, exc)
            return False
        self.passed_out += 1
        # our descriptor only: the connection lives on in the one passed
        transport.abort()
        return True

    def _flush(self) -> None:
        """Retry the waiting passes in order; serve here those out of time or refused."""
        self._retry = None
        now = time.monotonic()
        while self._waiting:
            transport, data, to, hops, deadline, here = self._waiting[0]
            sent = None if transport.is_closing() else self._send(transport, data, to, hops)
            if sent is None and not transport.is_closing() and now < deadline:
                break  # still full: try again in a millisecond
            self._waiting.popleft()
            if not sent and not transport.is_closing():
                transport.resume_reading()
                here()
        if self._waiting and self._sock is not None:
            self._retry = asyncio.get_running_loop().call_later(0.001, self._flush)

    def _receive(self) -> None:
        """Serve the connections other fronts passed here."""
        assert self._sock is not None
        while True:
            try:
                data, fds, flags, _ = socket.recv_fds(self._sock, MAX_PASSED_BYTES, 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("receiving a passed connection failed: %s", exc)
                return
            if not fds:
                continue
            conn = socket.socket(fileno=fds[0])
            if flags & socket.MSG_TRUNC or self.adopt is None:
                conn.close()
                continue
            self.passed_in += 1
            self._serve(conn, self.adopt(data[1:], data[0] if data else 1))

    def _serve(self, conn: socket.socket, protocol: asyncio.Protocol) -> None:
        loop = asyncio.get_running_loop()
        conn.setblocking(False)

        async def connect() -> None:
            try:
                await loop.connect_accepted_socket(lambda: protocol, sock=conn)
            except OSError as exc:
                log.warning("adopting a passed connection failed: %s", exc)
                conn.close()

        task = loop.create_task(connect())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


__all__ = ["MAX_PASSED_BYTES", "PASS_WAIT_S", "SocketPasser"]
