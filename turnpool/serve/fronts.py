"""Several front-end processes behind one ``turnpool serve`` address (``--frontends N``).

One event loop carries every session's frames, and past a few thousand steps per second that
loop is the server's ceiling. With ``frontends=N`` the ``turnpool serve`` process becomes a
supervisor (`FrontGroup`) of N front processes. Each runs the whole single-process server (the
app, the lean ``/ws`` path, a slot engine) over its own share of the pool's workers and slots,
and listens on the same host and port with ``SO_REUSEPORT``, so the kernel spreads new
connections over them. What no single front can see is settled between them over Unix sockets
in a private directory (`FrontLink`):

* **Placement by cost.** Each front publishes, ten times a second, its load (the measured
  step cost of the slots its sessions hold: `turnpool.pool.slots.SlotEngine.measured_load`),
  its sessions and its free slots in a small shared file. A front that accepts a new ``/ws``
  session while another front carries less by over half a session's cost, or while it has no
  free slot, passes the connection itself to the least loaded front: the socket's descriptor
  and the bytes read so far, over a Unix datagram socket (``SCM_RIGHTS``). The receiver
  serves it as if it had accepted it. So a front whose sessions step an expensive env takes
  fewer new sessions, not the same count.
* **Sessions by id.** A session id names its front (``f<k>-<hex>``). A WebSocket attaching to a
  session that another front holds is passed to that front the same way; an HTTP or MCP
  request for it (``/step``, ``/state``, ``/close``, ``/reset``, ``/mcp``) is proxied to the
  owner's private HTTP socket.
* **One server to look at.** ``/api/status`` and ``/metrics`` answer for the whole server: the
  front that gets the request asks the others (``?local=1``) and merges their answers (sums,
  workers and metrics labelled by ``front``).

Seeds: front ``k`` holds slots ``k*m .. k*m+m-1`` of an ``N*m``-slot server (its pool's base
seed is ``seed + k*m``), so a seeded reset gives the episode it gives on one front, and
seedless ones do not repeat across fronts. The supervisor restarts a front that dies (its
sessions end, as in a server restart); fronts end with the supervisor; `FrontGroup.stop`
ends them, and their workers, and removes the directory.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import dataclasses
import logging
import math
import mmap
import multiprocessing
import multiprocessing.connection
import os
import re
import shutil
import signal
import socket
import struct
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from turnpool.serve.engine import ServeSettings

if TYPE_CHECKING:
    from turnpool.serve.app import Server
    from turnpool.serve.engine import PoolEngine

log = logging.getLogger(__name__)

#: Seconds between two publications of a front's load.
PUBLISH_PERIOD_S = 0.1
#: Per front in the shared file: the summed step cost (s) of its measured sessions, how many
#: those are, its sessions, its free slots, its publication count.
_ROW = struct.Struct("<ddddd")
_COUNTS = struct.Struct("<dd")  # sessions and free slots, 16 bytes into a row
#: Largest message passed with a connection (the request head and what followed it).
MAX_PASSED_BYTES = 256 * 1024
#: Seconds a pass may wait for a full queue before the connection is served where it is.
PASS_WAIT_S = 1.0
#: Paths whose requests may name a session of another front.
ROUTED_PATHS = frozenset({"/reset", "/step", "/state", "/close", "/mcp"})
#: Header a proxied request carries (the owner serves it, never routes it again) and the
#: header of its answer naming the front that proxied it.
ROUTED_HEADER = "x-turnpool-routed-by"
#: Restarts of dead fronts the supervisor makes before it gives up and stops the server.
MAX_RESTARTS = 20
_SESSION_ID = re.compile(r"^f(\d{1,4})-")


def loads_path(directory: str) -> str:
    """The shared file of a group's published loads (`_ROW` per front)."""
    return os.path.join(directory, "loads")


def owner_of(session_id: Any) -> int | None:
    """The front a session id names (None: not a front's id)."""
    if not isinstance(session_id, str):
        return None
    m = _SESSION_ID.match(session_id)
    return int(m.group(1)) if m else None


@dataclasses.dataclass(frozen=True)
class FrontSpec:
    """What front ``index`` of ``count`` runs (picklable: it crosses a spawn)."""

    index: int
    count: int
    settings: ServeSettings
    host: str
    port: int
    token: str | None
    directory: str

    def http_path(self, k: int) -> str:
        return os.path.join(self.directory, f"front{k}.http")

    def fd_path(self, k: int) -> str:
        return os.path.join(self.directory, f"front{k}.fd")

    @property
    def loads_path(self) -> str:
        return loads_path(self.directory)


def front_settings(settings: ServeSettings, index: int, count: int) -> ServeSettings:
    """Front ``index``'s share: ``max_sessions`` and the HTTP cap split evenly (rounded up),
    the workers split evenly (one at least; all cores when ``num_workers`` is unset), and the
    slots' seeds those of its block of an undivided server."""
    per = math.ceil(settings.max_sessions / count)
    workers = settings.num_workers or os.cpu_count() or 1
    return dataclasses.replace(
        settings, frontends=1, max_sessions=per, seed=settings.seed + index * per,
        num_workers=max(1, round(workers / count)),
        max_http_sessions=max(1, math.ceil(settings.http_cap() / count)))


def reuse_port_socket(host: str, port: int, listen: bool) -> socket.socket:
    """A TCP socket bound with ``SO_REUSEPORT`` (listening if asked)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        if listen:
            sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


# ---------------------------------------------------------------------- the supervisor
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
                 ready_timeout: float = 180.0) -> None:
        from turnpool.serve import check_bind

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
        try:
            # held bound (never listening, so it takes no connection) until stop: the port
            # stays ours while a front restarts
            self._reserve = reuse_port_socket(host, port, listen=False)
            self.host, self.port = self._reserve.getsockname()[:2]
            self.url = f"http://{self.host}:{self.port}"
            with open(loads_path(self.directory), "wb") as f:
                f.write(bytes(_ROW.size * self.count))
            self.specs = [FrontSpec(k, self.count, front_settings(settings, k, self.count),
                                    self.host, self.port, token, self.directory)
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
                    if proc is None or proc.is_alive():
                        continue
                    proc.join(0)
                    self._up[k] = False
                    self._unpublish(k)
                    if self.restarts >= MAX_RESTARTS:
                        log.error("front %d died (exit %s); %d restarts made, giving up",
                                  k, proc.exitcode, self.restarts)
                        threading.Thread(target=self.stop, daemon=True).start()
                        return
                    self.restarts += 1
                    log.warning("front %d died (exit %s); restarting it", k, proc.exitcode)
                    try:
                        self._start(k)
                        self._await_ready(k)
                    except (OSError, RuntimeError, TimeoutError) as exc:
                        log.error("front %d did not restart: %s", k, exc)

    def _unpublish(self, k: int) -> None:
        """Blank a dead front's row: the others place nothing there until it is back."""
        with open(loads_path(self.directory), "r+b") as f:
            f.seek(k * _ROW.size)
            f.write(bytes(_ROW.size))

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
        procs = [p for p in self._procs if p is not None]
        for p in procs:
            if p.is_alive():
                p.terminate()
        end = time.monotonic() + timeout
        for p in procs:
            p.join(max(0.0, end - time.monotonic()))
            if p.is_alive():
                log.warning("front %s did not stop within %.0f s; killing it", p.name, timeout)
                p.kill()
                p.join(5.0)
        for conn in self._ready:
            if conn is not None:
                conn.close()
        reserve = getattr(self, "_reserve", None)
        if reserve is not None:
            reserve.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> FrontGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---------------------------------------------------------------------- a front process
def run_front(spec: FrontSpec, ready: Any) -> None:
    """A front process: the single-process server over its share, on the shared port (and
    on its private HTTP socket); ends on SIGTERM or when the supervisor is gone."""
    from turnpool.serve import _exit_on_sigterm, run_app
    from turnpool.serve.engine import PoolEngine

    logging.basicConfig(level=logging.WARNING)
    # uvicorn stops gracefully on SIGTERM and then re-raises it: as SystemExit, the
    # ``finally`` below still closes the pool (its workers and their files)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    threading.Thread(target=_end_with_parent, name="turnpool-front-parent",
                     daemon=True).start()
    try:
        engine = PoolEngine(spec.settings)
    except Exception as exc:
        ready.send(f"{type(exc).__name__}: {exc}")
        raise
    socks: list[socket.socket] = []
    try:
        socks.append(reuse_port_socket(spec.host, spec.port, listen=True))
        private = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        socks.append(private)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(spec.http_path(spec.index))
        private.bind(spec.http_path(spec.index))
        private.listen(256)
        link = FrontLink(spec, engine, on_ready=lambda: ready.send("ready"))
        run_app(engine, spec.token, socks, link=link)
    except Exception as exc:
        with contextlib.suppress(OSError):
            ready.send(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        for s in socks:
            s.close()
        engine.close()


def _end_with_parent() -> None:
    """SIGTERM ourselves (a clean stop: sessions closed, pool closed) once the supervisor is
    gone."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    parent.join()
    os.kill(os.getpid(), signal.SIGTERM)


class FrontLink:
    """A front's side of the group: its load published, new sessions placed, connections
    passed and received, HTTP requests routed, status and metrics gathered."""

    def __init__(self, spec: FrontSpec, engine: PoolEngine,
                 on_ready: Callable[[], None] | None = None) -> None:
        self.spec = spec
        self.index = spec.index
        self.count = spec.count
        self.engine = engine
        self.prefix = f"f{spec.index}-"
        self._on_ready = on_ready
        self._file = open(spec.loads_path, "r+b")  # noqa: SIM115 - held while serving
        self._map = mmap.mmap(self._file.fileno(), _ROW.size * spec.count)
        self._seen: list[tuple[float, float]] = [(-1.0, -1.0)] * spec.count
        #: per front, the cost of the passes this front sent there since its row last changed
        self._sent = [0.0] * spec.count
        self._published = 0.0
        self._fd_sock: socket.socket | None = None
        self._clients: dict[int, Any] = {}
        self._publisher: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        #: passes waiting for a full queue: (transport, data, to, hops, deadline, here)
        self._waiting: deque[tuple[Any, bytes, int, int, float, Callable[[], None]]] = deque()
        self._retry: asyncio.TimerHandle | None = None
        #: the uvicorn server serving this front (set before it runs)
        self.uvicorn: Any = None
        #: the sessions of this front (set by `turnpool.serve.app.create_app`)
        self.server: Server | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Begin publishing and receiving connections (in the app's lifespan)."""
        loop = asyncio.get_running_loop()
        path = self.spec.fd_path(self.index)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * MAX_PASSED_BYTES)
        sock.bind(path)
        self._fd_sock = sock
        loop.add_reader(sock.fileno(), self._receive)
        self.publish()
        self._publisher = asyncio.create_task(self._publish_forever())
        if self._on_ready is not None:
            self._on_ready()

    async def stop(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._publisher is not None:
            self._publisher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._publisher
        if self._fd_sock is not None:
            asyncio.get_running_loop().remove_reader(self._fd_sock.fileno())
            self._fd_sock.close()
            self._fd_sock = None
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()
        self._map.close()
        self._file.close()

    # ------------------------------------------------------------------ loads
    def _row(self, k: int) -> tuple[float, ...]:
        return _ROW.unpack_from(self._map, k * _ROW.size)

    def publish(self) -> None:
        cost, measured, leased = self.engine.measured_load()
        self._published += 1.0
        _ROW.pack_into(self._map, self.index * _ROW.size, cost, float(measured), float(leased),
                       float(self.engine.capacity - leased), self._published)

    def publish_count(self) -> None:
        """Publish this front's sessions and free slots now (a session opened or closed):
        a burst of new connections must not all be passed to a front that just filled."""
        if self._map.closed:  # sessions closed after the front stopped
            return
        leased = self.engine.leased
        _COUNTS.pack_into(self._map, self.index * _ROW.size + 16, float(leased),
                          float(self.engine.capacity - leased))

    def published(self) -> dict[str, float]:
        """This front's last publication (what other fronts place by)."""
        cost, measured, leased, free, seq = self._row(self.index)
        return {"measured_cost_s": cost, "measured": measured, "sessions": leased,
                "free": free, "publications": seq}

    async def _publish_forever(self) -> None:
        while True:
            await asyncio.sleep(PUBLISH_PERIOD_S)
            self.publish()

    def loads(self, rows: list[tuple[float, ...]] | None = None
              ) -> tuple[list[float], list[float], float]:
        """Per front its load and free slots, and one session's mean cost, from ``rows``
        (default: the shared file now): a front's load is its measured sessions' cost plus
        its other sessions at the mean cost of every measured session (1.0 each while none
        is measured: load is then a count). This front's sessions and free slots are taken
        live, the rest as published."""
        if rows is None:
            rows = [self._row(k) for k in range(self.count)]
        cost, measured = sum(r[0] for r in rows), sum(r[1] for r in rows)
        mean = cost / measured if measured > 0 and cost > 0 else 1.0
        loads, free = [], []
        for k, (c, m, leased, f, _) in enumerate(rows):
            if k == self.index:
                leased = float(self.engine.leased)
                f = float(self.engine.capacity) - leased
            loads.append(c + max(0.0, leased - m) * mean)
            free.append(f)
        return loads, free, mean

    def place(self, session_id: str | None, hops: int = 0) -> int | None:
        """The front a new ``/ws`` connection should go to (None: this one): a session's
        owner; else the least loaded front (what this front sent there since it last
        published counted at the mean cost) when this one carries more by over half a
        session's cost, or has no free slot. A connection already passed ``hops`` times is
        passed on only while this front is full, and at most ``count`` times in all."""
        if session_id:
            owner = owner_of(session_id)
            return owner if owner is not None and owner != self.index and \
                owner < self.count and hops == 0 else None
        if hops >= self.count or (hops and self.engine.leased < self.engine.capacity):
            return None
        rows = [self._row(k) for k in range(self.count)]  # one snapshot of the file
        loads, free, mean = self.loads(rows)
        full = free[self.index] < 1
        best, best_load = None, math.inf
        for k, (_, _, leased, _, seq) in enumerate(rows):
            if (seq, leased) != self._seen[k]:  # it published, or opened or closed a
                self._seen[k], self._sent[k] = (seq, leased), 0.0  # session: counted there
            pending = 0.0 if full else self._sent[k]  # full: any free slot beats refusing
            if k == self.index or seq <= 0 or free[k] - pending / mean < 1:
                continue  # not started yet, or no free slot there
            if loads[k] + pending < best_load:
                best, best_load = k, loads[k] + pending
        if best is None or (not full and loads[self.index] - best_load <= mean / 2):
            return None
        self._sent[best] += mean
        return best

    # ------------------------------------------------------------------ connections
    def pass_connection(self, transport: asyncio.Transport, data: bytes, to: int,
                        hops: int = 1, here: Callable[[], None] | None = None) -> bool:
        """Hand ``transport``'s connection, with the bytes read from it so far, to front
        ``to`` (its ``hops``-th pass); False (serve it here) if that cannot be done now.
        When ``to``'s queue is full (a burst: Linux queues 10 datagrams per socket by
        default) and ``here`` is given, the pass waits with the connection paused, retried
        each millisecond for up to `PASS_WAIT_S`, after which ``here()`` serves it on this
        front; True then too."""
        if transport.get_extra_info("socket") is None or self._fd_sock is None or \
                len(data) > MAX_PASSED_BYTES:
            return False
        if not self._waiting:
            sent = self._send(transport, data, to, hops)
            if sent is not None:
                return sent
        if here is None:
            return False
        transport.pause_reading()
        self._waiting.append((transport, data, to, hops, time.monotonic() + PASS_WAIT_S, here))
        if self._retry is None:
            self._retry = asyncio.get_running_loop().call_later(0.001, self._flush)
        return True

    def _send(self, transport: asyncio.Transport, data: bytes, to: int, hops: int
              ) -> bool | None:
        """One try: True if passed, False if it cannot be, None if ``to``'s queue is full."""
        assert self._fd_sock is not None
        sock = transport.get_extra_info("socket")
        try:
            # sendmsg itself: socket.send_fds drops its address argument
            self._fd_sock.sendmsg([bytes((hops,)), data], [(
                socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [sock.fileno()]))], 0,
                self.spec.fd_path(to))
        except BlockingIOError:
            return None
        except OSError as exc:  # it is restarting, or the client left
            log.debug("could not pass a connection to front %d: %s", to, exc)
            return False
        if self.server is not None:
            self.server.passed_out += 1
        # our descriptor only: the connection lives on in the one passed
        transport.abort()
        return True

    def _flush(self) -> None:
        """Retry the waiting passes in order; serve here those out of time or refused."""
        self._retry = None
        now = time.monotonic()
        while self._waiting:
            transport, data, to, hops, deadline, here = self._waiting[0]
            sent = None if transport.is_closing() else self._send(transport, data, to, hops)
            if sent is None and not transport.is_closing() and now < deadline:
                break  # still full: try again in a millisecond
            self._waiting.popleft()
            if not sent and not transport.is_closing():
                transport.resume_reading()
                here()
        if self._waiting and self._fd_sock is not None:
            self._retry = asyncio.get_running_loop().call_later(0.001, self._flush)

    def _receive(self) -> None:
        """Serve the connections other fronts passed here."""
        assert self._fd_sock is not None
        while True:
            try:
                data, fds, flags, _ = socket.recv_fds(self._fd_sock, MAX_PASSED_BYTES, 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("receiving a passed connection failed: %s", exc)
                return
            if not fds:
                continue
            conn = socket.socket(fileno=fds[0])
            if flags & socket.MSG_TRUNC:
                conn.close()
                continue
            if self.server is not None:
                self.server.passed_in += 1
            self._adopt(conn, data[1:], data[0] if data else 1)

    def _adopt(self, conn: socket.socket, data: bytes, hops: int) -> None:
        srv = self.uvicorn
        loop = asyncio.get_running_loop()
        conn.setblocking(False)
        proto = srv.config.http_protocol_class(config=srv.config,
                                               server_state=srv.server_state,
                                               app_state=srv.lifespan.state, _loop=loop)
        proto.passed, proto.hops = data, hops  # replayed at connection_made

        async def connect() -> None:
            try:
                await loop.connect_accepted_socket(lambda: proto, sock=conn)
            except OSError as exc:
                log.warning("adopting a passed connection failed: %s", exc)
                conn.close()

        task = loop.create_task(connect())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ HTTP
    def install(self, app: Any) -> None:
        """Put this front's `Router` in front of ``app``."""
        from turnpool.serve.app import MAX_MESSAGE_CHARS

        app.add_middleware(Router, link=self, max_body=MAX_MESSAGE_CHARS)

    def client(self, k: int) -> Any:
        import httpx

        client = self._clients.get(k)
        if client is None:
            client = httpx.AsyncClient(
                transport=httpx.AsyncHTTPTransport(uds=self.spec.http_path(k)),
                base_url="http://front", timeout=self.spec.settings.call_timeout_s())
            self._clients[k] = client
        return client

    async def _drop(self, k: int) -> None:
        """Forget the client of front ``k`` (it died: the next call connects afresh)."""
        client = self._clients.pop(k, None)
        if client is not None:
            with contextlib.suppress(Exception):
                await client.aclose()

    async def proxy(self, k: int, scope: dict[str, Any], body: bytes) -> tuple[int, list[
            tuple[bytes, bytes]], bytes]:
        """Forward one HTTP request to front ``k``: (status, headers, body)."""
        headers = [(n, v) for n, v in scope["headers"]
                   if n.lower() not in (b"host", b"content-length", b"connection")]
        headers.append((ROUTED_HEADER.encode(), str(self.index).encode()))
        try:
            resp = await self.client(k).request(
                scope["method"], scope["path"], params=scope.get("query_string", b"").decode(
                    "latin-1"), headers=headers, content=body)
        except Exception as exc:  # the owner is gone or restarting
            from turnpool.serve.app import dumps_bytes

            await self._drop(k)
            return 502, [(b"content-type", b"application/json")], dumps_bytes(
                {"detail": {"code": "SESSION_ERROR", "retryable": True,
                            "message": f"the front holding this session did not answer: "
                                       f"{type(exc).__name__}"}})
        out = [(b"content-type", resp.headers.get("content-type", "application/json")
                .encode()), (ROUTED_HEADER.encode(), str(self.index).encode())]
        return resp.status_code, out, resp.content

    async def gather(self, path: str) -> list[tuple[int, Any]]:
        """``path?local=1`` from every other front: (front, response or None)."""
        async def one(k: int) -> tuple[int, Any]:
            try:
                resp = await self.client(k).get(path, params={"local": "1"}, timeout=5.0)
                return k, resp if resp.status_code == 200 else None
            except Exception:  # a front restarting is left out of this answer
                await self._drop(k)
                return k, None

        others = [k for k in range(self.count) if k != self.index]
        return list(await asyncio.gather(*(one(k) for k in others)))

    async def merged_status(self, local: dict[str, Any]) -> dict[str, Any]:
        parts = {self.index: local}
        for k, resp in await self.gather("/api/status"):
            if resp is not None:
                parts[k] = resp.json()
        return merge_status(parts, self.count)

    async def merged_metrics(self, local: bytes) -> bytes:
        texts = {self.index: local.decode()}
        for k, resp in await self.gather("/metrics"):
            if resp is not None:
                texts[k] = resp.text
        return merge_metrics(texts)


def session_of_request(scope: dict[str, Any], body: bytes) -> Any:
    """The session id an HTTP request names (query ``session_id``, or the JSON body's
    ``session_id`` / ``params.session_id``); None when it names none."""
    from urllib.parse import parse_qsl

    query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
    if query.get("session_id"):
        return query["session_id"]
    if not body or b"session_id" not in body:
        return None
    import json

    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    params = data.get("params")
    if data.get("session_id") is None and isinstance(params, dict):
        return params.get("session_id")
    return data.get("session_id")


class Router:
    """ASGI middleware of a front: a request naming another front's session goes there."""

    def __init__(self, app: Any, link: FrontLink, max_body: int) -> None:
        self.app = app
        self.link = link
        self.max_body = max_body

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] != "http" or scope["path"] not in ROUTED_PATHS or any(
                n == ROUTED_HEADER.encode() for n, _ in scope["headers"]):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size, more = 0, True
        while more and size <= self.max_body:
            msg = await receive()
            if msg["type"] != "http.request":
                return
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            more = msg.get("more_body", False)
        body = b"".join(chunks)
        owner = owner_of(session_of_request(scope, body)) if not more else None
        if owner is None or owner == self.link.index or owner >= self.link.count:
            await self.app(scope, _replay(body, more, receive), send)
            return
        status, headers, content = await self.link.proxy(owner, scope, body)
        headers.append((b"content-length", str(len(content)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})


def _replay(body: bytes, more: bool, receive: Callable[[], Awaitable[Any]]
            ) -> Callable[[], Awaitable[Any]]:
    """``receive`` that gives ``body`` first (then the rest, if there is more)."""
    first = True

    async def again() -> Any:
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": body, "more_body": more}
        return await receive()

    return again


# ---------------------------------------------------------------------- merging answers
_SUMMED = ("num_workers", "capacity", "active_sessions", "steps_total", "resets_total",
           "batches_total", "step_rate", "refused_sessions", "reaped_sessions")


def merge_status(parts: dict[int, dict[str, Any]], count: int) -> dict[str, Any]:
    """One ``/api/status`` from the fronts' own: totals summed, workers and sessions listed
    with their front, latency percentiles from the summed histogram counts."""
    from turnpool.serve.app import MAX_LISTED_SESSIONS
    from turnpool.serve.metrics import quantiles

    first = parts[min(parts)]
    out = {k: v for k, v in first.items() if k not in ("pid", "placement")}
    for key in (*_SUMMED, "passed_out", "passed_in"):
        out[key] = sum(p.get(key) or 0 for p in parts.values())
    failures: Counter[str] = Counter()
    for p in parts.values():
        failures.update(p.get("failures") or {})
    out["failures"] = dict(failures)
    out["uptime_s"] = max(p.get("uptime_s") or 0.0 for p in parts.values())
    out["recent_failures"] = [f for p in parts.values() for f in p.get("recent_failures") or []]
    out["workers"] = [{**w, "front": k} for k, p in sorted(parts.items())
                      for w in p.get("workers") or []]
    sessions = [s for p in parts.values() for s in p.get("sessions") or []]
    out["sessions"] = sessions[:MAX_LISTED_SESSIONS]
    buckets = [p.get("latency_buckets") for p in parts.values()]
    summed = [sum(col) for col in zip(*[b for b in buckets if b])] if any(buckets) else []
    latency = quantiles(summed)
    out["latency_p50_ms"], out["latency_p99_ms"] = latency["p50_ms"], latency["p99_ms"]
    out["latency_buckets"] = summed
    out["frontends"] = [
        {"front": k, "up": k in parts,
         **({key: parts[k].get(key) for key in ("pid", "active_sessions", "step_rate",
                                                "capacity", "passed_out", "passed_in",
                                                "placement")}
            if k in parts else {})}
        for k in range(count)]
    return out


def merge_metrics(texts: dict[int, str]) -> bytes:
    """One Prometheus exposition from the fronts' own, every sample labelled ``front``."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.metrics_core import Metric
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.samples import Sample

    families: dict[str, Metric] = {}
    for k, text in sorted(texts.items()):
        for fam in text_string_to_metric_families(text):
            merged = families.get(fam.name)
            if merged is None:
                merged = families[fam.name] = Metric(fam.name, fam.documentation, fam.type)
            merged.samples.extend(
                Sample(s.name, {**s.labels, "front": str(k)}, s.value, s.timestamp, s.exemplar)
                for s in fam.samples)

    class _Merged:
        def collect(self) -> Iterable[Metric]:
            return list(families.values())

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged())  # type: ignore[arg-type]
    out: bytes = generate_latest(registry)
    return out


__all__ = ["FrontGroup", "FrontLink", "FrontSpec", "Router", "front_settings",
           "merge_metrics", "merge_status", "owner_of", "run_front"]
