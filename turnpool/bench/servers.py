"""The two servers ``turnpool bench serve`` (and the other serve benches) drive, as child
processes: OpenEnv's reference server over turnpool's Sokoban class, and ``turnpool serve``;
or a server already running elsewhere (``--url``). ``python -m turnpool.bench.servers
reference MAX_SESSIONS`` runs the reference server.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

from turnpool.bench.ws_client import _raise_fd_limit

ENV = "sokoban"
SERVERS = ("openenv", "turnpool")


#: ``turnpool-f<N>``: ``turnpool serve --frontends N``; ``turnpool-<backend>``: its pool on
#: another backend (``turnpool serve`` defaults to ``process``)
_VARIANT = re.compile(r"turnpool-(?:f(?P<fronts>\d+)|(?P<backend>sequential|thread|process_pool))")


def fronts_of(kind: str) -> int:
    """The front processes of a server kind: ``turnpool`` 1, ``turnpool-f<N>`` N."""
    m = _VARIANT.fullmatch(kind)
    return int(m["fronts"]) if m and m["fronts"] else 1


def backend_of(kind: str) -> str | None:
    """The pool backend of a server kind: ``turnpool-sequential`` -> ``sequential``."""
    m = _VARIANT.fullmatch(kind)
    return m["backend"] if m else None


def known_server(kind: str) -> bool:
    return kind in SERVERS or _VARIANT.fullmatch(kind) is not None


def reference_app(max_sessions: int) -> Any:
    """OpenEnv's ``create_app`` over turnpool's Sokoban class wrapped as an OpenEnv env."""
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State

    from turnpool.envs.registry import make

    class TextAction(Action):
        action: str | int

    class TextObservation(Observation):
        text: str = ""

    class WrappedEnv(Environment):  # type: ignore[misc]
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            super().__init__()
            self.env = make(ENV)
            self._state = State()

        def reset(self, seed: int | None = None, episode_id: str | None = None,
                  **kwargs: Any) -> TextObservation:
            obs, _ = self.env.reset(seed=seed)
            self._state = State(episode_id=episode_id or uuid.uuid4().hex, step_count=0)
            return TextObservation(text=obs, done=False, reward=None)

        def step(self, action: TextAction, timeout_s: float | None = None,
                 **kwargs: Any) -> TextObservation:
            obs, reward, terminated, truncated, _ = self.env.step(action.action)
            self._state.step_count += 1
            return TextObservation(text=obs, done=terminated or truncated, reward=reward)

        @property
        def state(self) -> State:
            return self._state

        def close(self) -> None:
            self.env.close()

    return create_app(WrappedEnv, TextAction, TextObservation, env_name=ENV,
                      max_concurrent_envs=max_sessions)


def _run_reference(max_sessions: int) -> None:
    import uvicorn

    from turnpool.serve.running import bind_socket

    _raise_fd_limit()
    sock = bind_socket("127.0.0.1", 0)
    host, port = sock.getsockname()[:2]
    app = reference_app(max_sessions)
    print(f"reference serving at http://{host}:{port}", flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False, loop="asyncio",
                            ws_ping_interval=None, timeout_graceful_shutdown=3)
    uvicorn.Server(config).run(sockets=[sock])


class RunningServer:
    """A server started elsewhere (``--url``): only its URL is known."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def rss_mb(self) -> float | None:
        return None

    def cpu_s(self) -> float | None:
        return None

    def close(self) -> None:
        pass


class ServerProcess:
    """A server in a child process; ``url`` once it is listening."""

    def __init__(self, kind: str, max_sessions: int, timeout: float = 300.0,
                 cmd: list[str] | None = None, stderr: Any = None) -> None:
        """``cmd``: another server command line (it must print its URL on its first line),
        ``stderr``: where its stderr goes (default: ours)."""
        if cmd is None and kind == "openenv":
            cmd = [sys.executable, "-m", "turnpool.bench.servers", "reference",
                   str(max_sessions)]
        elif cmd is None:
            cmd = [sys.executable, "-m", "turnpool.cli", "serve", "--env", ENV, "--port", "0",
                   "--max-sessions", str(max_sessions), "--session-timeout", "3600",
                   "--frontends", str(fronts_of(kind))]
            if backend_of(kind):
                cmd += ["--backend", str(backend_of(kind))]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        line = _read_line(self.proc, timeout)
        if "http://" not in line:
            self.close()
            raise RuntimeError(f"the {kind} server did not start within {timeout:.0f} s: "
                               f"{line!r}")
        url = next(w for w in line.split() if w.startswith("http://"))
        self.url = url.rstrip(",")
        self.settle()

    def settle(self, timeout: float = 60.0, period: float = 0.5, busy: float = 0.05) -> None:
        """Wait (up to ``timeout`` s) until the server's processes use under ``busy`` of a
        core over ``period`` s: what a server does once after it starts (a pool's standby
        worker starting at low priority) is not the CPU of the steps measured next."""
        deadline = time.monotonic() + timeout
        before = self.cpu_s()
        while time.monotonic() < deadline:
            time.sleep(period)
            now = self.cpu_s()
            if now - before < busy * period:
                return
            before = now

    def _procs(self) -> list[Any]:
        import psutil

        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    def rss_mb(self) -> float:
        """Resident memory of the server process and its children (the pool's workers)."""
        total = 0
        for p in self._procs():
            with contextlib.suppress(Exception):
                total += p.memory_info().rss
        return total / 2**20

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the server process and its live children used."""
        total = 0.0
        for p in self._procs():
            with contextlib.suppress(Exception):
                t = p.cpu_times()
                total += t.user + t.system
        return total

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)


def _read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    out = proc.stdout
    assert out is not None
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(out.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return got[0] if got else ""


if __name__ == "__main__":  # the reference server's process
    if sys.argv[1] == "reference":
        _run_reference(int(sys.argv[2]))
