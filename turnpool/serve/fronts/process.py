"""A front process: the single-process server over its share of the pool, on the shared
port (and on its private HTTP socket, for requests other fronts proxy to it)."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import threading
from pathlib import Path
from typing import Any

from turnpool.serve.engine import PoolEngine
from turnpool.serve.fronts.link import FrontLink
from turnpool.serve.fronts.spec import FrontSpec, reuse_port_socket
from turnpool.serve.journal import FileJournal
from turnpool.serve.resume import open_journal
from turnpool.serve.running import exit_on_sigterm, run_app
from turnpool.serve.service import Service


def run_front(spec: FrontSpec, ready: Any) -> None:
    """Serve front ``spec.index`` until SIGTERM or the supervisor is gone; ``ready`` (a
    pipe) hears ``"ready"`` or why it failed to start."""
    logging.basicConfig(level=logging.WARNING)
    # uvicorn stops gracefully on SIGTERM and then re-raises it: as SystemExit, the
    # ``finally`` below still closes the pool (its workers and their files)
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    threading.Thread(target=_end_with_parent, name="turnpool-front-parent",
                     daemon=True).start()
    try:
        engine = PoolEngine(spec.settings)
    except Exception as exc:
        ready.send(f"{type(exc).__name__}: {exc}")
        raise
    socks: list[socket.socket] = []
    journal: FileJournal | None = None
    try:
        socks.append(reuse_port_socket(spec.host, spec.port, listen=True))
        private = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        socks.append(private)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(spec.http_path(spec.index))
        private.bind(spec.http_path(spec.index))
        private.listen(256)
        link = FrontLink(spec, engine, on_ready=lambda: ready.send("ready"))
        service = Service(engine, spec.token, id_prefix=link.prefix,
                          on_sessions=link.publish_count)
        if spec.journal_dir is not None:  # its sessions, as it left them (a restart too)
            journal, _ = open_journal(service.sessions, engine, Path(spec.journal_dir),
                                      spec.fsync, front=(spec.index, spec.count))
        run_app(service, socks, link,
                before_shutdown=journal.keep_sessions if journal is not None else None)
    except Exception as exc:
        with contextlib.suppress(OSError):
            ready.send(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        for s in socks:
            s.close()
        if journal is not None:
            journal.close()
        engine.close()


def _end_with_parent() -> None:
    """SIGTERM ourselves (a clean stop: sessions closed, pool closed) once the supervisor is
    gone."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    parent.join()
    os.kill(os.getpid(), signal.SIGTERM)


__all__ = ["run_front"]
