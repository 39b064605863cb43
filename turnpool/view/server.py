"""Where the viewer listens: 127.0.0.1 only (a file of episodes is nobody else's business),
on the socket `turnpool.listen.bind_socket` binds first, so ``port=0`` is named before the
page is served.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from turnpool.extras import require
from turnpool.listen import UvicornThread, bind_socket
from turnpool.view.files import Run, load

HOST = "127.0.0.1"


def _uvicorn_server(run: Run) -> Any:
    require("fastapi", feature="turnpool view", extra="serve")
    uvicorn = require("uvicorn", feature="turnpool view", extra="serve")
    from turnpool.view.app import create_app

    config = uvicorn.Config(create_app(run), log_level="warning", access_log=False,
                            lifespan="off")
    return uvicorn.Server(config)


def serve_view(run: Run, port: int = 0, on_ready: Callable[[str], None] | None = None
               ) -> None:
    """Serve ``run`` in the foreground until interrupted."""
    server = _uvicorn_server(run)
    sock = bind_socket(HOST, port)
    try:
        if on_ready is not None:
            host, bound = sock.getsockname()[:2]
            on_ready(f"http://{host}:{bound}/")
        server.run(sockets=[sock])
    finally:
        sock.close()


class ViewServer:
    """The viewer on a daemon thread (tests, notebooks); a context manager."""

    def __init__(self, path: str | Path, port: int = 0, env: str | None = None) -> None:
        """Read ``path`` and serve it on a thread (``port=0``: a free one); ``env`` names
        the env of a tree file."""
        self.run = load(path, env=env)
        server = _uvicorn_server(self.run)
        self._thread = UvicornThread(server, bind_socket(HOST, port), "turnpool-view")
        self.url = self._thread.url

    def stop(self) -> None:
        self._thread.stop(timeout=10.0)

    def __enter__(self) -> ViewServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["HOST", "ViewServer", "serve_view"]
