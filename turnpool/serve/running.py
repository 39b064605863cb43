"""Running one ``turnpool serve`` process: the listening socket, uvicorn with the ``/ws``
path in front of its HTTP protocol (`turnpool.serve.ws`), and `TurnpoolServer`, the server
on a background thread (tests, benchmarks, notebooks).
"""

from __future__ import annotations

import contextlib
import gc
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import turnpool.serve.ws as ws
from turnpool.extras import require
from turnpool.listen import UvicornThread, bind_socket
from turnpool.serve.app import Peers, app_for
from turnpool.serve.engine import PoolEngine, ServeSettings
from turnpool.serve.journal import FileJournal
from turnpool.serve.resume import Resumed, kept_snapshot_key, open_journal
from turnpool.serve.service import Service

log = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    """Whether ``host`` only listens on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None, allow_remote: bool) -> None:
    """Refuse to listen beyond this machine unless asked to, and never without a token."""
    if is_loopback(host):
        return
    if not allow_remote:
        raise PermissionError(f"{host} listens beyond this machine; pass allow_remote "
                              "(--allow-remote) and a token to mean it")
    if not token:
        raise PermissionError(f"listening on {host} needs a token")


def exit_on_sigterm(signum: int, frame: Any) -> None:
    """A SIGTERM handler: uvicorn stops gracefully on SIGTERM and then re-raises it; as
    `SystemExit`, the caller's ``finally`` still closes the pool."""
    raise SystemExit(0)


class FrontPeers(Peers, ws.Placement, Protocol):
    """What one front of several adds to the single-process server
    (`turnpool.serve.fronts.link.FrontLink`)."""

    prefix: str

    def publish_count(self) -> None: ...

    def serve_passed_with(self, adopt: Callable[[bytes, int], Any]) -> None: ...


def uvicorn_server(service: Service, peers: FrontPeers | None = None,
                   before_shutdown: Callable[[], None] | None = None) -> Any:
    """uvicorn over the app of ``service``, with `turnpool.serve.ws` as its ``http`` and
    ``ws`` protocols: ``/ws`` upgrades are served there, every other request by uvicorn's
    own HTTP protocol. ``before_shutdown`` runs when the server starts to shut down, before
    it ends any connection (the session journal's `keep_sessions`: sessions outlive a restart)."""
    uvicorn = require("uvicorn", feature="turnpool serve", extra="serve")
    from uvicorn.config import HTTP_PROTOCOLS
    from uvicorn.importer import import_from_string

    entry, ws_class = ws.bind(service, import_from_string(HTTP_PROTOCOLS["auto"]), peers)
    # uvloop where installed (the serve extra): its transports' reads and writes run
    # in C, ~4-6 µs less of the loop's CPU per served step (docs/performance.md); the
    # protocols take either loop's transports
    config = uvicorn.Config(app_for(service, peers), log_level="warning", access_log=False,
                            lifespan="on", timeout_keep_alive=300, loop="auto", http=entry,
                            ws=ws_class, timeout_graceful_shutdown=3, ws_ping_interval=None)
    server = uvicorn.Server(config)
    if before_shutdown is not None:
        server.shutdown = _first(before_shutdown, server.shutdown)
    if peers is not None:
        peers.serve_passed_with(
            lambda data, hops: ws.adopt(ws_class, server.server_state, data, hops))
    return server


def _first(hook: Callable[[], None], shutdown: Callable[..., Awaitable[None]]
           ) -> Callable[..., Awaitable[None]]:
    """uvicorn's ``Server.shutdown`` with ``hook()`` run first."""
    async def shutdown_after_hook(*args: Any, **kwargs: Any) -> None:
        hook()
        await shutdown(*args, **kwargs)
    return shutdown_after_hook


#: The cyclic collector's first threshold while a server runs in the foreground (CPython's
#: default is 700): see `collector_for_serving`.
SERVING_GC_THRESHOLD = 10_000


@contextlib.contextmanager
def collector_for_serving() -> Iterator[None]:
    """The cyclic garbage collector set for a server that owns its process, restored after.

    Why: each round of served steps leaves hundreds of objects alive until its replies are
    written (requests, waiters, results), so at CPython's default threshold the collector ran
    every few rounds, and each object that lived through two of those runs (the pool's replay
    log keeps every turn's actions) brought the next full collection nearer; every full one
    walked the whole heap (modules, the app, every session): 30-70 ms each, ~3 µs of server
    CPU per step at 1,024 sessions (docs/performance.md). So what exists once the server is
    built is frozen out of the collector's sight (`gc.freeze`), and the young generation is
    collected every `SERVING_GC_THRESHOLD` net allocations: a round's objects are freed by
    their reference counts before a collection sees them. Cyclic garbage is still
    collected, a little later."""
    thresholds = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(SERVING_GC_THRESHOLD, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def run_app(service: Service, sockets: list[socket.socket],
            peers: FrontPeers | None = None,
            before_shutdown: Callable[[], None] | None = None) -> None:
    """Serve ``service`` on already bound ``sockets`` until uvicorn exits, in the
    foreground of a process the server owns (`collector_for_serving`)."""
    server = uvicorn_server(service, peers, before_shutdown)
    with collector_for_serving():
        server.run(sockets=sockets)


class TurnpoolServer:
    """``turnpool serve`` on ``host:port`` in a background thread; ``stop()`` is idempotent
    and ends every worker of the pool (the server owns its engine). With ``state_dir``, its
    sessions are journaled there and those it holds are resumed first (``resumed``)."""

    def __init__(self, settings: ServeSettings, host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None, allow_remote: bool = False,
                 state_dir: Path | None = None, fsync: str = "batch") -> None:
        check_bind(host, token, allow_remote)
        if state_dir is not None:
            settings = kept_snapshot_key(settings, Path(state_dir))
        self.engine = PoolEngine(settings)
        self.journal: FileJournal | None = None
        self.resumed: Resumed | None = None
        try:
            service = Service(self.engine, token)
            if state_dir is not None:
                self.journal, self.resumed = open_journal(service.sessions, self.engine,
                                                          state_dir, fsync)
            sock = bind_socket(host, port)
            keep = self.journal.keep_sessions if self.journal is not None else None
            self._runner = UvicornThread(uvicorn_server(service, before_shutdown=keep), sock,
                                         "turnpool-serve")
        except BaseException:
            self._close()
            raise
        self.host, self.port, self.url = self._runner.host, self._runner.port, self._runner.url

    def stop(self, timeout: float = 10.0) -> None:
        if self._runner.stop(timeout):
            self._close()

    def _close(self) -> None:
        if self.journal is not None:
            self.journal.close()
        self.engine.close()

    def __enter__(self) -> TurnpoolServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["FrontPeers", "TurnpoolServer", "UvicornThread", "bind_socket", "check_bind",
           "collector_for_serving", "exit_on_sigterm", "is_loopback", "run_app",
           "uvicorn_server"]
