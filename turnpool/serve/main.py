"""``turnpool serve`` in the foreground: one process (`turnpool.serve.running`), or a
supervisor of several front processes (`turnpool.serve.fronts`) with ``frontends > 1``."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from turnpool.serve.engine import PoolEngine, ServeSettings
from turnpool.serve.journal import FileJournal
from turnpool.serve.resume import Resumed, kept_snapshot_key, open_journal
from turnpool.serve.running import bind_socket, check_bind, exit_on_sigterm, run_app
from turnpool.serve.service import Service


def serve(settings: ServeSettings, host: str = "127.0.0.1", port: int = 8000,
          token: str | None = None, on_ready: Callable[[str], None] | None = None,
          allow_remote: bool = False, state_dir: Path | None = None, fsync: str = "batch",
          on_resumed: Callable[[Resumed], None] | None = None) -> None:
    """Run the server in the foreground until interrupted (Ctrl-C / SIGTERM); the pool's
    workers (and, with ``settings.frontends > 1``, the front processes) are stopped on the
    way out either way. With ``state_dir`` every session is journaled there
    (`turnpool.serve.journal`, ``fsync`` its policy) and the sessions it holds are resumed
    before the server listens (``on_resumed`` hears how that went)."""
    check_bind(host, token, allow_remote)
    durable = Durable(state_dir, fsync, on_resumed) if state_dir is not None else None
    if state_dir is not None:
        settings = kept_snapshot_key(settings, state_dir)
    previous = None
    if threading.current_thread() is threading.main_thread():
        # uvicorn shuts down gracefully on SIGTERM and then re-raises it; this handler turns
        # that into SystemExit so the ``finally`` below still closes the pool.
        previous = signal.signal(signal.SIGTERM, exit_on_sigterm)
    try:
        if settings.frontends > 1:
            _serve_fronts(settings, host, port, token, on_ready, allow_remote, durable)
        else:
            _serve_one(settings, host, port, token, on_ready, durable)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


class Durable(NamedTuple):
    """Where and how a server journals its sessions."""

    state_dir: Path
    fsync: str
    on_resumed: Callable[[Resumed], None] | None


def _serve_one(settings: ServeSettings, host: str, port: int, token: str | None,
               on_ready: Callable[[str], None] | None, durable: Durable | None) -> None:
    engine = PoolEngine(settings)
    journal: FileJournal | None = None
    try:
        sock = bind_socket(host, port)
        try:
            service = Service(engine, token)
            if durable is not None:
                journal, resumed = open_journal(service.sessions, engine, durable.state_dir,
                                                durable.fsync)
                if durable.on_resumed is not None:
                    durable.on_resumed(resumed)
            if on_ready is not None:
                bound_host, bound_port = sock.getsockname()[:2]
                on_ready(f"http://{bound_host}:{bound_port}")
            run_app(service, [sock], before_shutdown=journal.keep_sessions if journal else None)
        finally:
            sock.close()
    finally:
        if journal is not None:
            journal.close()
        engine.close()


def _serve_fronts(settings: ServeSettings, host: str, port: int, token: str | None,
                  on_ready: Callable[[str], None] | None, allow_remote: bool,
                  durable: Durable | None) -> None:
    """The supervisor of ``settings.frontends`` front processes, in the foreground (each
    front journals and resumes its own sessions, in ``front<k>/`` of the state dir)."""
    from turnpool.serve.fronts.supervisor import FrontGroup

    state_dir = str(durable.state_dir.absolute()) if durable is not None else None
    fsync = durable.fsync if durable is not None else "batch"
    with FrontGroup(settings, host, port, token, allow_remote, state_dir=state_dir,
                    fsync=fsync) as group:
        if on_ready is not None:
            on_ready(group.url)
        group.wait()


__all__ = ["serve"]
