"""``turnpool serve`` in the foreground: one process (`turnpool.serve.running`), or a
supervisor of several front processes (`turnpool.serve.fronts`) with ``frontends > 1``."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

from turnpool.serve.engine import PoolEngine, ServeSettings
from turnpool.serve.running import bind_socket, check_bind, exit_on_sigterm, run_app
from turnpool.serve.service import Service


def serve(settings: ServeSettings, host: str = "127.0.0.1", port: int = 8000,
          token: str | None = None, on_ready: Callable[[str], None] | None = None,
          allow_remote: bool = False) -> None:
    """Run the server in the foreground until interrupted (Ctrl-C / SIGTERM); the pool's
    workers (and, with ``settings.frontends > 1``, the front processes) are stopped on the
    way out either way."""
    check_bind(host, token, allow_remote)
    previous = None
    if threading.current_thread() is threading.main_thread():
        # uvicorn shuts down gracefully on SIGTERM and then re-raises it; this handler turns
        # that into SystemExit so the ``finally`` below still closes the pool.
        previous = signal.signal(signal.SIGTERM, exit_on_sigterm)
    try:
        if settings.frontends > 1:
            _serve_fronts(settings, host, port, token, on_ready, allow_remote)
        else:
            _serve_one(settings, host, port, token, on_ready)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _serve_one(settings: ServeSettings, host: str, port: int, token: str | None,
               on_ready: Callable[[str], None] | None) -> None:
    engine = PoolEngine(settings)
    try:
        sock = bind_socket(host, port)
        try:
            if on_ready is not None:
                bound_host, bound_port = sock.getsockname()[:2]
                on_ready(f"http://{bound_host}:{bound_port}")
            run_app(Service(engine, token), [sock])
        finally:
            sock.close()
    finally:
        engine.close()


def _serve_fronts(settings: ServeSettings, host: str, port: int, token: str | None,
                  on_ready: Callable[[str], None] | None, allow_remote: bool) -> None:
    """The supervisor of ``settings.frontends`` front processes, in the foreground."""
    from turnpool.serve.fronts.supervisor import FrontGroup

    with FrontGroup(settings, host, port, token, allow_remote) as group:
        if on_ready is not None:
            on_ready(group.url)
        group.wait()


__all__ = ["serve"]
