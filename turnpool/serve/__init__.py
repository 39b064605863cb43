"""``turnpool serve``: the env pool behind OpenEnv's wire protocol.

Trainers that speak OpenEnv (TRL, SkyRL, NeMo Gym, verifiers, ...) connect to one URL and get
one env per session, while the envs run in an `EnvPool` on any backend, with per-env process
isolation, enforced step timeouts, crash recovery and exact seeds. ``engine.py`` holds the
settings and builds the pool's `turnpool.pool.slots.SlotEngine` (one driver thread, the steps
of all sessions batched, results ready-first); ``app.py`` speaks the protocol
(``/ws``, ``/reset``, ``/step``, ``/state``, ``/schema``, ``/health``, ``/metadata``) and
serves the status page of ``page.py``; ``fastws.py`` sits in front of uvicorn on the same port
and serves ``/ws`` upgrades straight from the socket (the step hot path), handing every other
request to uvicorn.

Example:
    >>> from turnpool.serve import ServeSettings, TurnpoolServer
    >>> with TurnpoolServer(ServeSettings(env="trivial", max_sessions=2,
    ...                                   backend="sequential")) as server:
    ...     import httpx
    ...     httpx.get(server.url + "/health").json()
    {'status': 'healthy'}
"""

from __future__ import annotations

import ipaddress
import logging
import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from turnpool.serve.app import create_app
from turnpool.serve.engine import PoolEngine, ServeSettings
from turnpool.webshop.server import UvicornThread, bind_socket

if TYPE_CHECKING:
    from turnpool.serve.app import Link

log = logging.getLogger(__name__)

__all__ = ["PoolEngine", "ServeSettings", "TurnpoolServer", "check_bind", "create_app",
           "is_loopback", "run_app", "serve"]


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


def _uvicorn_server(app: Any) -> Any:
    """uvicorn over ``app``, with `turnpool.serve.fastws` in front of its HTTP protocol:
    ``/ws`` upgrades are served there, every other request by uvicorn as usual."""
    import uvicorn
    from uvicorn.config import HTTP_PROTOCOLS
    from uvicorn.importer import import_from_string

    from turnpool.serve.fastws import front_protocol

    front = front_protocol(app.state.server, app.state.tools,
                           import_from_string(HTTP_PROTOCOLS["auto"]), app.state.link)
    # asyncio's own loop: uvloop measured no less CPU per step on the lean /ws path
    # (docs/performance.md); the front takes either loop's transports
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                            timeout_keep_alive=300, loop="asyncio", http=front,
                            timeout_graceful_shutdown=3, ws_ping_interval=None)
    return uvicorn.Server(config)


class TurnpoolServer:
    """``turnpool serve`` on ``host:port`` in a background thread; ``stop()`` is idempotent
    and ends every worker of the pool (the server owns its engine)."""

    def __init__(self, settings: ServeSettings, host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None, allow_remote: bool = False) -> None:
        check_bind(host, token, allow_remote)
        self.engine = PoolEngine(settings)
        try:
            self._sock = bind_socket(host, port)
        except OSError:
            self.engine.close()
            raise
        self._runner = UvicornThread(_uvicorn_server(create_app(self.engine, token)),
                                     self._sock, "turnpool-serve")
        self.host, self.port, self.url = self._runner.host, self._runner.port, self._runner.url

    def stop(self, timeout: float = 10.0) -> None:
        if self._runner.stop(timeout):
            self.engine.close()

    def __enter__(self) -> TurnpoolServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(0)


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
        previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        if settings.frontends > 1:
            _serve_fronts(settings, host, port, token, on_ready, allow_remote)
            return
        engine = PoolEngine(settings)
        try:
            sock = bind_socket(host, port)
            try:
                if on_ready is not None:
                    bound_host, bound_port = sock.getsockname()[:2]
                    on_ready(f"http://{bound_host}:{bound_port}")
                run_app(engine, token, [sock])
            finally:
                sock.close()
        finally:
            engine.close()
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def run_app(engine: PoolEngine, token: str | None, sockets: list[Any],
            link: Link | None = None) -> None:
    """Serve the app over ``engine`` on already bound ``sockets`` until uvicorn exits."""
    server = _uvicorn_server(create_app(engine, token, link))
    if link is not None:
        link.uvicorn = server
    server.run(sockets=sockets)


def _serve_fronts(settings: ServeSettings, host: str, port: int, token: str | None,
                  on_ready: Callable[[str], None] | None, allow_remote: bool) -> None:
    """The supervisor of ``settings.frontends`` front processes, in the foreground."""
    from turnpool.serve.fronts import FrontGroup

    with FrontGroup(settings, host, port, token, allow_remote) as group:
        if on_ready is not None:
            on_ready(group.url)
        group.wait()
