"""The supervisor of a multi-front server: N front processes on one ``host:port``
(`FrontGroup`), what each runs (`FrontSpec`, `front_settings`) and the restart of a front that
dies."""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import shutil
import socket
import tempfile
import threading
import time
from typing import Any

from turnpool.serve.engine import ServeSettings
from turnpool.serve.fronts.placement import LoadBoard
from turnpool.serve.fronts.process import run_front
from turnpool.serve.fronts.spec import FrontSpec, front_settings, reuse_port_socket
from turnpool.serve.running import check_bind
from turnpool.worker.children import sigint_blocked

log = logging.getLogger(__name__)

#: Restarts of dead fronts the supervisor makes before it gives up and stops the server.
MAX_RESTARTS = 20


class FrontGroup:
    """N front processes on one ``host:port``; `stop` is idempotent and bounded.

    Example:
        >>> with FrontGroup(ServeSettings(env="trivial", frontends=2, num_workers=2,
        ...                               max_sessions=4)) as group:
        ...     import httpx
        ...     httpx.get(group.url + "/api/status").json()["capacity"]
        4
    """

    def __init__(self, settings: ServeSettings, host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None, allow_remote: bool = False,
                 ready_timeout: float = 180.0, state_dir: str | None = None,
                 fsync: str = "batch") -> None:
        check_bind(host, token, allow_remote)
        if settings.frontends < 2:
            raise ValueError("a FrontGroup runs 2 or more fronts (frontends=1: TurnpoolServer)")
        self.count = settings.frontends
        self.ready_timeout = ready_timeout
        self.directory = tempfile.mkdtemp(prefix="turnpool-fronts-")
        self._stopped = False
        self._lock = threading.Lock()
        self.restarts = 0
        self._procs: list[Any] = [None] * self.count
        self._ready: list[Any] = [None] * self.count
        self._up = [False] * self.count
        self._reserve: socket.socket | None = None
        try:
            # held bound (never listening, so it takes no connection) until stop: the port
            # stays ours while a front restarts
            self._reserve = reuse_port_socket(host, port, listen=False)
            self.host, self.port = self._reserve.getsockname()[:2]
            self.url = f"http://{self.host}:{self.port}"
            LoadBoard.create(self.directory, self.count)
            self.specs = [FrontSpec(k, self.count, front_settings(settings, k, self.count),
                                    self.host, self.port, token, self.directory, state_dir,
                                    fsync)
                          for k in range(self.count)]
            self._ctx = multiprocessing.get_context("spawn")
            for k in range(self.count):
                self._start(k)
            for k in range(self.count):
                self._await_ready(k)
        except BaseException:
            self.stop()
            raise
        self._watcher = threading.Thread(target=self._watch, name="turnpool-fronts",
                                         daemon=True)
        self._watcher.start()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p is not None]

    def _start(self, k: int) -> None:
        ours, theirs = self._ctx.Pipe(duplex=False)
        proc = self._ctx.Process(target=run_front, args=(self.specs[k], theirs),
                                 name=f"turnpool-front-{k}")
        # a front is stopped by this supervisor (SIGTERM), never by the terminal's Ctrl-C: it
        # starts with SIGINT blocked, so a Ctrl-C while its interpreter starts is the
        # supervisor's alone, not a fatal error in the front; the Ctrl-C lands here once the
        # front is on record, so `stop` ends it too
        with sigint_blocked("spawn"):
            proc.start()
            theirs.close()
            self._ready[k], self._procs[k], self._up[k] = ours, proc, False

    def _await_ready(self, k: int) -> None:
        proc, conn = self._procs[k], self._ready[k]
        if not conn.poll(self.ready_timeout):
            raise TimeoutError(f"front {k} did not start within {self.ready_timeout:g} s")
        try:
            msg = conn.recv()
        except EOFError:
            msg = None
        if msg != "ready":
            raise RuntimeError(f"front {k} failed to start (exit code {proc.exitcode}): {msg}")
        self._up[k] = True

    def _watch(self) -> None:
        """Restart a front that died (bounded); stop the group when restarts run out."""
        while not self._stopped:
            procs = [p for p in self._procs if p is not None]
            multiprocessing.connection.wait([p.sentinel for p in procs], timeout=1.0)
            with self._lock:
                if self._stopped:
                    return
                for k, proc in enumerate(self._procs):
                    if proc is not None and not proc.is_alive() and not self._restart(k):
                        return

    def _restart(self, k: int) -> bool:
        """Restart dead front ``k``; False when restarts ran out (the group is stopping)."""
        proc = self._procs[k]
        proc.join(0)
        self._up[k] = False
        LoadBoard.blank(self.directory, k)  # the others place nothing there until it is back
        if self.restarts >= MAX_RESTARTS:
            log.error("front %d died (exit %s); %d restarts made, giving up",
                      k, proc.exitcode, self.restarts)
            threading.Thread(target=self.stop, daemon=True).start()
            return False
        self.restarts += 1
        log.warning("front %d died (exit %s); restarting it", k, proc.exitcode)
        try:
            self._start(k)
            self._await_ready(k)
        except (OSError, RuntimeError, TimeoutError) as exc:
            log.error("front %d did not restart: %s", k, exc)
        return True

    def wait(self) -> None:
        """Block until the group stops (`stop`, or its restarts ran out)."""
        while not self._stopped:
            self._watcher.join(1.0)
            if not self._watcher.is_alive():
                break

    def alive(self) -> bool:
        """Whether every front is up (started, and not dead since)."""
        return not self._stopped and all(
            up and p is not None and p.is_alive() for up, p in zip(self._up, self._procs,
                                                                   strict=True))

    def stop(self, timeout: float = 15.0) -> None:
        """End every front (SIGTERM: each closes its sessions and its pool; SIGKILL after
        ``timeout``), then free the port and remove the directory."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        try:  # a second SIGTERM while stopping still leaves no directory behind
            procs = [p for p in self._procs if p is not None]
            for p in procs:
                if p.is_alive():
                    p.terminate()
            end = time.monotonic() + timeout
            for p in procs:
                p.join(max(0.0, end - time.monotonic()))
                if p.is_alive():
                    log.warning("front %s did not stop within %.0f s; killing it", p.name,
                                timeout)
                    p.kill()
                    p.join(5.0)
        finally:
            for conn in self._ready:
                if conn is not None:
                    conn.close()
            if self._reserve is not None:
                self._reserve.close()
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> FrontGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["MAX_RESTARTS", "FrontGroup"]
