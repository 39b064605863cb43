"""Listening sockets and uvicorn on a thread: what the shop and ``turnpool serve`` share.

Both servers bind their socket first (so ``port=0`` names the port before anything runs) and
hand it to uvicorn, in the foreground or on a daemon thread. This module imports nothing of
turnpool, so both floors use it (the serve floor may not import the shop's code: it needs the
``webshop`` extra).

    >>> sock = bind_socket()  # 127.0.0.1, a free port
    >>> sock.getsockname()[0]
    '127.0.0.1'
    >>> sock.close()
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any

log = logging.getLogger(__name__)


def bind_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening TCP socket; ``port=0`` picks a free one."""
    # IPPROTO_TCP (not 0) so asyncio sets TCP_NODELAY on accepted connections; without it a
    # keep-alive reply waits ~40 ms for a delayed ACK (Nagle).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


class UvicornThread:
    """A uvicorn ``server`` run on a daemon thread over an already bound socket (which it
    owns from here on); `stop` is idempotent and bounded. The shop and ``turnpool serve``
    both run this way in tests and benchmarks."""

    def __init__(self, server: Any, sock: socket.socket, name: str) -> None:
        self._sock = sock
        self.host, self.port = sock.getsockname()[:2]
        self.url = f"http://{self.host}:{self.port}"
        self._server = server
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                                        name=f"{name}-{self.port}", daemon=True)
        self._thread.start()
        self._stopped = False

    def stop(self, timeout: float) -> bool:
        """Ask the server to exit and wait up to ``timeout`` s; False if already stopped."""
        if self._stopped:
            return False
        self._stopped = True
        self._server.should_exit = True
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("%s thread did not stop within %.1f s", self._thread.name, timeout)
        self._sock.close()
        return True


__all__ = ["UvicornThread", "bind_socket"]
