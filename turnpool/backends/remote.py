"""The one lifecycle of every backend whose workers run outside the caller's loop (processes,
Ray actors, or threads: joblib's ``threading``, ``sequential_env_types``): the typed handshake
(`WorkerInit` out, `Hello` back), the worker's side (`serve_worker`: build an `EnvHost`, say
hello, run `turnpool.worker.handoff.HandoffServer`), the pool's side (`RemoteBackend`: start,
greet, standby, restart, send, progress, close) and the connection transport
(`StreamBackend`). A backend supplies "start a worker and give me its pipes"; docs/design.md
("One remote lifecycle") has the whole picture.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import select
import socket
import time
from abc import abstractmethod
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_for
from typing import Any, ClassVar, Generic, TypeVar

from turnpool.backends.base import (
    Backend,
    BackendUnavailable,
    EnvBuildError,
    WorkerHandle,
    WorkerLost,
    raise_build_errors,
)
from turnpool.extras import MissingExtra, require
from turnpool.worker.build import EnvBuild
from turnpool.worker.errors import short_error
from turnpool.worker.handoff import DEFAULT_HANDOFF_AFTER
from turnpool.worker.host import EnvHost
from turnpool.worker.protocol import Op, Reply, Request
from turnpool.worker.transport import (
    CLOSE_GRACE_S,
    PROTOCOL,
    ProgressSlot,
    ProgressWriter,
    serve,
)

log = logging.getLogger(__name__)

#: How long a restart may take before the worker's envs are failed instead.
RESTART_TIMEOUT_S = 120.0
_CLOSE = pickle.dumps((0, Op.CLOSE, None), PROTOCOL)


@dataclass(frozen=True)
class WorkerInit:
    """What a worker is given: its slot and which start of that slot this is
    (``incarnation``: a hello of an older one is ignored), its envs, its progress file and the
    hand-off settings of its request loop."""

    slot: int
    incarnation: int
    builds: list[EnvBuild]
    progress_path: str
    handoff_after: float | None = None
    step_timeout: float | None = None


@dataclass(frozen=True)
class Hello:
    """A worker's answer once its envs are built: who it is and what failed to build."""

    slot: int
    incarnation: int
    pid: int
    build_errors: dict[int, str]
    hostname: str = ""
    node: str = ""


def build_host(init: WorkerInit, node: str = "", progress: ProgressWriter | None = None
               ) -> tuple[EnvHost, Hello]:
    """The worker's `EnvHost` for ``init`` and the `Hello` that reports it."""
    host = EnvHost(init.builds, progress or ProgressWriter(init.progress_path))
    return host, Hello(init.slot, init.incarnation, os.getpid(), dict(host.build_errors),
                       socket.gethostname(), node)


def serve_worker(recv_bytes: Callable[[], bytes], send_bytes: Callable[[bytes], None],
                 init: WorkerInit, progress: ProgressWriter | None = None) -> None:
    """A worker's life once it has its `WorkerInit`: build, say hello, serve until closed."""
    host, hello = build_host(init, progress=progress)
    send_bytes(pickle.dumps(hello, PROTOCOL))
    serve(recv_bytes, send_bytes, host, init.handoff_after, init.step_timeout)


H = TypeVar("H", bound=WorkerHandle)


class RemoteBackend(Backend, Generic[H]):
    """Workers elsewhere, each serving one slice. A backend implements `_launch`,
    `_await_hello`, `_stop`, `_post`, `wait` and `recv` (`StreamBackend` has the last three
    for connections), and may keep a standby (`_load`, `_promote`, `_park`).
    ``handoff_after``: the request loop's hand-off threshold (None: off)."""

    #: the exceptions of `start` that mean "this backend cannot run here"
    start_errors: ClassVar[tuple[type[BaseException], ...]] = (
        OSError, WorkerLost, TimeoutError, ValueError, EOFError, pickle.PicklingError)
    #: how many times a restart is tried before the worker's envs are failed
    restart_attempts: ClassVar[int] = 1
    #: the optional package this backend needs (its extra has the same name)
    extra: ClassVar[str] = ""

    def __init__(self, builds: Sequence[EnvBuild], num_workers: int | None = None, *,
                 mp_context: str | None = None,
                 handoff_after: float | None = DEFAULT_HANDOFF_AFTER,
                 **options: Any) -> None:
        super().__init__(builds, num_workers, mp_context=mp_context, **options)
        if handoff_after is not None and not handoff_after > 0:
            raise ValueError(f"handoff_after must be > 0 seconds or None, got {handoff_after!r}")
        self.handoff_after = handoff_after
        #: what the start-failure message names beside the backend (a start method...)
        self.flavour = ""
        self._workers: list[H | None] = [None] * self.num_workers
        self._incarnations: list[int] = []  # per worker, from `start`
        self._use_standby = False
        self._standby: H | None = None
        self._owner_pid = os.getpid()
        self._timeout = 60.0
        self._started = self._closed = False

    # ------------------------------------------------------------------ what a backend adds
    @abstractmethod
    def _launch(self, slot: int | None) -> H:
        """Start a worker for ``slot`` (its `WorkerInit` is `_init`), or an idle standby
        (None); must not wait for it."""

    def _launch_all(self, slots: list[int]) -> list[H]:
        return [self._launch(k) for k in slots]

    def _load(self, worker: H, slot: int) -> None:
        """Give an idle standby the slice of ``slot``."""
        raise NotImplementedError

    def _promote(self, standby: H) -> bool:
        """Make a standby fit to serve (False: it cannot be; a fresh worker is started)."""
        return True

    def _park(self, standby: H) -> None:
        """A standby is up (or, after a restart, started): let it wait without slowing steps."""

    @abstractmethod
    def _await_hello(self, worker: H, slot: int | None, deadline: float) -> Hello | None:
        """Wait until the worker of ``slot`` has said hello (None: until the standby is up)."""

    @abstractmethod
    def _stop(self, worker: H) -> None:
        """Stop a worker now (kill what can be killed) and release what it holds; a lost or
        stuck worker is stopped before its replacement starts."""

    @abstractmethod
    def _post(self, worker: H, data: bytes) -> None:
        """Hand a pickled request to the worker."""

    def _join(self, workers: list[H], timeout: float) -> None:
        """Wait (at most ``timeout`` in all) for workers told to close to end."""
        deadline = time.monotonic() + timeout
        for w in workers:
            w.join(max(0.0, deadline - time.monotonic()))

    def _prepare(self) -> None:
        """Before the first worker starts (a runtime, a socket, a preload)."""

    def _release(self) -> None:
        """After every worker is stopped (and after a failed start, and in a forked copy)."""

    # ------------------------------------------------------------------ the lifecycle
    def _init(self, slot: int, progress: ProgressSlot) -> WorkerInit:
        return WorkerInit(slot, self._incarnations[slot], self.builds_of(slot), progress.path,
                          self.handoff_after, self.step_timeout)

    def _greet(self, worker: H, hello: Hello | None) -> None:
        assert hello is not None  # a worker with a slot always says hello
        worker.pid = hello.pid
        worker.progress.unlink()  # mapped by the worker (or not visible to it): the name can go
        raise_build_errors(hello.build_errors)

    def start(self, timeout: float) -> None:
        self._timeout = timeout
        deadline = time.monotonic() + timeout
        self._incarnations = [0] * self.num_workers
        try:
            if self.extra:
                require(self.extra, feature=f"the {self.name} backend", extra=self.extra)
            self._prepare()
            # every worker starts before any is waited for, the standby with them: a process
            # still starting up once start() has returned would take CPU from the first steps
            self._workers = list(self._launch_all(list(range(self.num_workers))))
            self._standby = self._launch(None) if self._use_standby else None
            for k, w in enumerate(self._workers):
                assert w is not None
                self._greet(w, self._await_hello(w, k, deadline))
            if self._standby is not None:
                self._await_hello(self._standby, None, deadline)
                self._park(self._standby)
            self._started = True
        except (EnvBuildError, BackendUnavailable):  # the envs are broken, or it says why
            self.close()
            raise
        except MissingExtra as exc:
            self.close()
            raise BackendUnavailable(str(exc)) from exc
        except self.start_errors as exc:
            self.close()
            kind = f"{self.name} ({self.flavour})" if self.flavour else self.name
            raise BackendUnavailable(f"{kind} workers did not start: {short_error(exc)}"
                                     ) from exc

    def restart(self, worker: int) -> None:
        old = self._workers[worker]
        self._workers[worker] = None
        if old is not None:
            self._stop(old)
        error: BaseException | None = None
        deadline = time.monotonic() + max(self._timeout, RESTART_TIMEOUT_S)
        failures: tuple[type[BaseException], ...] = (*self.start_errors, EnvBuildError)
        for _ in range(self.restart_attempts):
            self._incarnations[worker] += 1
            fresh: H | None = None
            try:
                fresh = self._take_standby(worker) or self._launch(worker)
                self._workers[worker] = fresh
                self._greet(fresh, self._await_hello(fresh, worker, deadline))
            except failures as exc:
                self._workers[worker] = None
                if fresh is not None:
                    self._stop(fresh)
                error = exc
                continue
            if self._use_standby and self._standby is None and not self._closed:
                self._standby = self._launch(None)  # nobody waits for it (recovery first)
                self._park(self._standby)
            return
        raise WorkerLost(f"{self.name} worker {worker} did not restart: "
                         f"{short_error(error) if error else 'no attempt'}")

    def _take_standby(self, slot: int) -> H | None:
        standby, self._standby = self._standby, None
        if standby is None:
            return None
        if not self._promote(standby):
            log.info("cannot restore the standby worker's priority; starting a fresh worker")
            self._stop(standby)
            self._use_standby = False  # it could never be promoted here
            return None
        self._load(standby, slot)
        return standby

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        workers = [w for w in self._workers if w is not None]
        standby, self._standby = self._standby, None
        self._workers = [None] * len(self._workers)
        if os.getpid() != self._owner_pid:  # a forked copy of the owner: drop our ends only
            for w in workers + ([standby] if standby else []):
                w.close_pipes()
        else:
            if standby is not None:  # holds no envs; may still be starting
                self._stop(standby)
            self._shutdown(workers)
        self._release()

    def _shutdown(self, workers: list[H]) -> None:
        """Ask live workers to close their envs, give them `CLOSE_GRACE_S`, stop them all."""
        for w in workers:
            if not w.lost:
                with contextlib.suppress(Exception):
                    self._post(w, _CLOSE)
        self._join(workers, CLOSE_GRACE_S)
        for w in workers:
            self._stop(w)

    # ------------------------------------------------------------------ what the pool calls
    def _live(self, worker: int) -> H:
        w = self._workers[worker]
        if w is None or w.lost:
            raise WorkerLost(f"{self.name} worker {worker} is gone")
        return w

    def send(self, worker: int, request: Request) -> None:
        w = self._live(worker)
        data = pickle.dumps(request, PROTOCOL)  # an unpicklable action fails here, in the pool
        try:
            self._post(w, data)
        except OSError as exc:
            w.lost = True
            raise WorkerLost(f"{self.name} worker {worker}: {exc}") from exc

    def progress(self, worker: int) -> tuple[int, float] | None:
        w = self._workers[worker] if self._workers else None
        return None if w is None else w.read_progress()

    def worker_pids(self) -> list[int]:
        pids = [w.pid for w in self._workers
                if w is not None and w.local and w.pid > 0 and w.pid != self._owner_pid]
        if self._standby is not None and self._standby.pid > 0:
            pids.append(self._standby.pid)
        return pids


@dataclass(eq=False, kw_only=True)
class Stream(WorkerHandle):
    """A worker reached over connections: ``conn`` carries replies in, ``out`` requests out
    (the same socket, or two one-way pipes); ``sentinel`` (a fd, or -1) becomes readable when
    its process ends."""

    conn: Connection | None = None
    out: Connection | None = None
    sentinel: int = -1

    def close_pipes(self) -> None:
        for c in {id(c): c for c in (self.conn, self.out) if c is not None}.values():
            c.close()


S = TypeVar("S", bound=Stream)


class StreamBackend(RemoteBackend[S]):
    """`RemoteBackend` over connections: one pickled request out, one pickled reply (or a
    partial one and its late parts) back, waited for with ``poll(2)`` on the connections and
    the workers' sentinels, so nothing spins and a death is seen at once."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._exited: set[int] = set()  # workers whose sentinel fired in the last wait

    def _death(self, worker: int | None, w: S) -> str:
        """Why the worker's replies stopped (its exit, where the backend knows it)."""
        return f"{self.name} worker {worker} died"

    def _post(self, worker: S, data: bytes) -> None:
        assert worker.out is not None
        worker.out.send_bytes(data)

    def _await_hello(self, worker: S, slot: int | None, deadline: float) -> Hello | None:
        """The hello on the worker's own connection (a standby's: any first message); its
        sentinel firing first is a death."""
        conn = worker.conn
        assert conn is not None
        watched: list[Any] = [conn] + ([worker.sentinel] if worker.sentinel >= 0 else [])
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"worker {slot} did not start in time")
            ready = wait_for(watched, left)
            if conn in ready:
                try:
                    hello = pickle.loads(conn.recv_bytes())
                except (EOFError, OSError) as exc:
                    raise WorkerLost(f"{self._death(slot, worker)} while starting") from exc
                if slot is None or isinstance(hello, Hello):
                    return None if slot is None else hello
            elif ready:
                raise WorkerLost(f"{self._death(slot, worker)} while starting")

    def restart(self, worker: int) -> None:
        self._exited.discard(worker)
        super().restart(worker)

    def _fds(self, workers: Collection[int]) -> tuple[dict[int, tuple[int, bool]], list[int]]:
        """fd -> (worker, is its sentinel) over ``workers``' connections, and those gone."""
        fds: dict[int, tuple[int, bool]] = {}
        dead: list[int] = []
        for k in workers:
            w = self._workers[k]
            if w is None or w.lost or w.conn is None:
                dead.append(k)
                continue
            fds[w.conn.fileno()] = (k, False)
            if w.sentinel >= 0:
                fds[w.sentinel] = (k, True)
        return fds, dead

    def wait_fds(self, workers: Collection[int]) -> list[int] | None:
        fds, dead = self._fds(workers)
        return None if dead else list(fds)

    def wait(self, workers: Collection[int], timeout: float | None) -> list[int]:
        fds, dead = self._fds(workers)
        if dead:
            return dead
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        ready: set[int] = set()
        for fd, _ in poller.poll(None if timeout is None else max(0.0, timeout) * 1000.0):
            k, exited = fds[fd]
            ready.add(k)
            if exited:
                self._exited.add(k)
        return sorted(ready)

    def recv(self, worker: int) -> Reply:
        w = self._workers[worker]
        try:
            # A worker can reply and then die: read what it sent before declaring it lost.
            if (w is not None and w.conn is not None and not w.lost
                    and (worker not in self._exited or w.conn.poll(0))):
                reply: Reply = pickle.loads(w.conn.recv_bytes())
                return reply
        except (EOFError, OSError):
            pass
        self._exited.discard(worker)
        if w is None:
            raise WorkerLost(f"{self.name} worker {worker} is gone")
        why = self._death(worker, w)
        w.lost = True
        raise WorkerLost(why)


__all__ = ["RESTART_TIMEOUT_S", "Hello", "RemoteBackend", "Stream", "StreamBackend", "WorkerInit",
           "build_host", "serve_worker"]
