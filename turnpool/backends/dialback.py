"""Workers that someone else's machinery starts (an executor, joblib, a thread of the caller):
one task per worker that lives as long as the pool, dials back to its private `Rendezvous`,
proves with a token that it is ours before anything is unpickled, then serves there
(`dial_and_serve`), so no call to that machinery happens per step. A stuck task can be
stopped with `INTERRUPT` instead of killing its process (which would break loky's other
workers).
"""

from __future__ import annotations

import hmac
import logging
import os
import pickle
import secrets
import signal
import socket
import threading
import time
from abc import abstractmethod
from collections.abc import Callable
from multiprocessing.connection import Client, Connection
from typing import Any

from turnpool.backends.remote import Hello, S, StreamBackend, WorkerInit, serve_worker
from turnpool.worker.transport import ProgressWriter, watch_parent

log = logging.getLogger(__name__)

_TOKEN_BYTES = 32
#: the progress value a task writes when it has returned (its process is free again)
FINISHED = -2
INTERRUPT = signal.SIGUSR1


class Interrupted(BaseException):
    """Raised in a task by `INTERRUPT`; not an ``Exception``, so env-level handlers do not
    swallow it and the task unwinds and returns."""


def _on_interrupt(signum: int, frame: Any) -> None:
    signal.signal(INTERRUPT, signal.SIG_IGN)  # once; a late second signal is harmless
    raise Interrupted()


def dial_and_serve(address: str, token: bytes, init: WorkerInit, owner_pid: int,
                   die_with_parent: bool = False) -> int:
    """A worker's task: watch the pool's process, dial back, prove itself with the token,
    serve until the pool hangs up or interrupts it; returns the slot (unused)."""
    watch_parent(owner_pid, die_with_parent)  # nothing to watch in a thread of the caller
    signals = os.getpid() != owner_pid and threading.current_thread() is threading.main_thread()
    if signals:
        signal.signal(INTERRUPT, _on_interrupt)
    progress = ProgressWriter(init.progress_path)  # opened now: the pool unlinks it soon
    try:
        conn = Client(address, family="AF_UNIX")
        try:
            conn.send_bytes(token)
            serve_worker(conn.recv_bytes, conn.send_bytes, init, progress)
        finally:
            conn.close()
    except (EOFError, OSError, Interrupted):
        pass  # closed (or stopped) by the pool
    finally:
        if signals:
            signal.signal(INTERRUPT, signal.SIG_IGN)  # the process may go on serving others
        progress(FINISHED)
    return init.slot


class Rendezvous:
    """A private listening socket (Linux abstract namespace: no file); a hello that arrives
    for another worker than the one awaited is kept for it."""

    def __init__(self, prefix: str) -> None:
        self.token = secrets.token_bytes(_TOKEN_BYTES)
        self.address = f"\0turnpool-{prefix}-" + secrets.token_hex(12)
        self._sock: socket.socket | None = None
        self._early: dict[tuple[int, int], tuple[Connection, Hello]] = {}

    def open(self, backlog: int) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self.address)
        sock.listen(max(8, backlog))
        self._sock = sock

    def accept(self, slot: int, incarnation: int, deadline: float,
               alive: Callable[[], bool]) -> tuple[Connection, Hello]:
        """Accept connections until worker ``slot`` (this incarnation) has said hello, while
        ``alive()`` and before ``deadline``."""
        while (slot, incarnation) not in self._early:
            left = deadline - time.monotonic()
            if left <= 0 or not alive():
                why = "in time" if left <= 0 else "(whatever ran it ended first)"
                raise TimeoutError(f"worker {slot} did not connect {why}")
            assert self._sock is not None
            # Short slices: a launcher that fails is noticed within a fraction of a second.
            self._sock.settimeout(min(left, 0.2))
            try:
                client, _ = self._sock.accept()
            except TimeoutError:
                continue
            client.settimeout(None)
            conn = Connection(client.detach())
            try:
                hello = self._handshake(conn, deadline)
            except (OSError, EOFError, TimeoutError, ValueError) as exc:
                log.warning("rejected a connection on the worker socket: %s", exc)
                conn.close()
                continue
            self._early[(hello.slot, hello.incarnation)] = (conn, hello)
        return self._early.pop((slot, incarnation))

    def _handshake(self, conn: Connection, deadline: float) -> Hello:
        if not conn.poll(max(0.0, deadline - time.monotonic())):
            raise TimeoutError("no token")
        if not hmac.compare_digest(conn.recv_bytes(maxlength=_TOKEN_BYTES), self.token):
            raise ValueError("bad token")
        # Envs are built between token and hello; the worker is ours, so its pickles are trusted.
        if not conn.poll(max(0.0, deadline - time.monotonic())):
            raise TimeoutError("no hello")
        hello = pickle.loads(conn.recv_bytes())
        if not isinstance(hello, Hello):
            raise ValueError("bad hello")
        return hello

    def close(self) -> None:
        for conn, _ in self._early.values():
            conn.close()
        self._early.clear()
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class DialBackBackend(StreamBackend[S]):
    """`StreamBackend` whose workers run `dial_and_serve` (`_task`: its arguments) in someone
    else's machinery; `_running` says whether that task still runs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rendezvous = Rendezvous(self.name)

    @abstractmethod
    def _running(self, worker: S) -> bool:
        """Does whatever runs the worker's task still run it (else no hello will come)?"""

    def _task(self, init: WorkerInit, die_with_parent: bool = False
              ) -> tuple[str, bytes, WorkerInit, int, bool]:
        return (self._rendezvous.address, self._rendezvous.token, init, self._owner_pid,
                die_with_parent)

    def _prepare(self) -> None:
        self._rendezvous.open(self.num_workers)

    def _await_hello(self, worker: S, slot: int | None, deadline: float) -> Hello:
        assert slot is not None  # no standby: the machinery decides where tasks run
        conn, hello = self._rendezvous.accept(slot, self._incarnations[slot], deadline,
                                              lambda: self._running(worker))
        worker.conn = worker.out = conn
        return hello

    def _release(self) -> None:
        self._rendezvous.close()


__all__ = ["FINISHED", "INTERRUPT", "DialBackBackend", "Rendezvous", "dial_and_serve"]
