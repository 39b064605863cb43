"""The one lifecycle of every backend whose workers are other processes (or, for
``process_pool``'s ``sequential_env_types``, a thread of the caller).

The process, process_pool, joblib and Ray backends differ only in how a worker is started and
how bytes reach it. Here, once: the typed handshake (`WorkerInit` out, `Hello` back); the
worker's side (`serve_worker`: build an `EnvHost`, say hello, then run
`turnpool.worker.handoff.HandoffServer`, every worker's one loop); the pool's side
(`RemoteBackend`: start, greet, standby, restart, progress, close in order); and connections
(`StreamBackend`: send / ``poll(2)`` wait / recv, a death seen through the worker's sentinel
or the connection's end). Workers that someone else's machinery starts dial back
(`turnpool.backends.dialback`). A backend supplies "start a worker and give me its pipes";
which backends a caller may use at all is decided once, at the choice
(`turnpool.backends.choice.refuse_unsupported`).
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


# ====================================================================== the handshake
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
    """The worker's `EnvHost` for ``init`` (writing ``progress``, else a writer of its own)
    and the `Hello` that reports it."""
    host = EnvHost(init.builds, progress or ProgressWriter(init.progress_path))
    return host, Hello(init.slot, init.incarnation, os.getpid(), dict(host.build_errors),
                       socket.gethostname(), node)


def serve_worker(recv_bytes: Callable[[], bytes], send_bytes: Callable[[bytes], None],
                 init: WorkerInit, progress: ProgressWriter | None = None) -> None:
    """A worker's life once it has its `WorkerInit`: build, say hello, serve until closed."""
    host, hello = build_host(init, progress=progress)
    send_bytes(pickle.dumps(hello, PROTOCOL))
    serve(recv_bytes, send_bytes, host, init.handoff_after, init.step_timeout)


# ====================================================================== the pool's side
H = TypeVar("H", bound=WorkerHandle)


class RemoteBackend(Backend, Generic[H]):
    """Workers in other processes, each serving one slice (see the module docstring).

    Subclasses implement `_launch`, `_await_hello`, `_stop` and the transport (`send`,
    `wait`, `recv`; `StreamBackend` has them for connections), and may offer a standby
    (`_load`, `_promote`). ``handoff_after`` is the request loop's hand-off threshold
    (`DEFAULT_HANDOFF_AFTER` by default, so one stalled env never holds back its worker-mates;
    None: off).
    """

    #: the exceptions of `start` that mean "this backend cannot run here"
    start_errors: ClassVar[tuple[type[BaseException], ...]] = (
        OSError, WorkerLost, TimeoutError, ValueError, EOFError, pickle.PicklingError)
    #: how many times a restart is tried before the worker's envs are failed
    restart_attempts: ClassVar[int] = 1

    def __init__(self, builds: Sequence[EnvBuild], num_workers: int | None = None, *,
                 mp_context: str | None = None,
                 handoff_after: float | None = DEFAULT_HANDOFF_AFTER,
                 **options: Any) -> None:
        super().__init__(builds, num_workers, mp_context=mp_context, **options)
        if handoff_after is not None and not handoff_after > 0:
            raise ValueError(f"handoff_after must be > 0 seconds or None, got {handoff_after!r}")
        self.handoff_after = handoff_after
        self._workers: list[H | None] = [None] * self.num_workers
        self._incarnations = [0] * self.num_workers
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

    def _load(self, worker: H, slot: int) -> None:
        """Give an idle standby the slice of ``slot`` (backends with a standby)."""
        raise NotImplementedError

    def _promote(self, standby: H) -> bool:
        """Make a standby fit to serve (False: it cannot be, it is stopped and none is kept)."""
        return True

    @abstractmethod
    def _await_hello(self, worker: H, slot: int | None, deadline: float) -> Hello | None:
        """Wait until the worker of ``slot`` has said hello (None: until the standby is up)."""

    def _launch_all(self, slots: list[int]) -> list[H]:
        """Start the workers of ``slots`` (at start: every slot)."""
        return [self._launch(k) for k in slots]

    @abstractmethod
    def _stop(self, worker: H) -> None:
        """Stop a worker now (kill what can be killed) and release what it holds; a lost or
        stuck worker is stopped before its replacement starts."""

    def _prepare(self) -> None:
        """Before the first worker starts (a runtime, a socket, a preload)."""

    def _shutdown(self, workers: list[H]) -> None:
        """Ask live workers to close their envs, give them `CLOSE_GRACE_S`, stop the rest."""
        for w in workers:
            self._stop(w)

    def _release(self) -> None:
        """After every worker is stopped (and after a failed start, and in a forked copy)."""

    def _start_failed(self, exc: BaseException) -> str:
        return f"{self.name} workers did not start: {short_error(exc)}"

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
        try:
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
            self._started = True
        except (EnvBuildError, BackendUnavailable):  # the envs are broken, or it says why
            self.close()
            raise
        except self.start_errors as exc:
            self.close()
            raise BackendUnavailable(self._start_failed(exc)) from exc

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
            self._replenish()
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

    def _replenish(self) -> None:
        """Start the next standby; nobody waits for it (recovery first)."""
        if self._use_standby and self._standby is None and not self._closed:
            self._standby = self._launch(None)

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
            self._release()
            return
        if standby is not None:  # holds no envs; may still be starting
            self._stop(standby)
        self._shutdown(workers)
        self._release()

    # ------------------------------------------------------------------ what the pool reads
    def _live(self, worker: int) -> H:
        w = self._workers[worker]
        if w is None or w.lost:
            raise WorkerLost(f"{self.name} worker {worker} is gone")
        return w

    def progress(self, worker: int) -> tuple[int, float] | None:
        w = self._workers[worker] if self._workers else None
        return None if w is None else w.read_progress()

    def worker_pids(self) -> list[int]:
        pids = [w.pid for w in self._workers
                if w is not None and w.local and w.pid > 0 and w.pid != self._owner_pid]
        if self._standby is not None and self._standby.pid > 0:
            pids.append(self._standby.pid)
        return pids


# ====================================================================== connections
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
    """`RemoteBackend` whose workers talk over connections: one pickled request out, one
    pickled reply (or a partial one and its late parts) back, waited for with ``poll(2)``
    on the connections and the workers' sentinels, so nothing spins and a death is seen at
    once."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._exited: set[int] = set()  # workers whose sentinel fired in the last wait

    def _death(self, worker: int | None, w: S) -> str:
        """Why the worker's replies stopped (its exit, where the backend knows it)."""
        return f"{self.name} worker {worker} died"

    def _say_close(self, workers: list[S]) -> None:
        """Ask each live worker to close its envs (the request loop's ``close``)."""
        bye = pickle.dumps((0, Op.CLOSE, None), PROTOCOL)
        for w in workers:
            if not w.lost and w.out is not None:
                with contextlib.suppress(OSError):
                    w.out.send_bytes(bye)

    def _shutdown(self, workers: list[S]) -> None:
        self._say_close(workers)
        deadline = time.monotonic() + CLOSE_GRACE_S
        for w in workers:
            self._join(w, max(0.0, deadline - time.monotonic()))
        for w in workers:
            self._stop(w)

    def _join(self, worker: S, timeout: float) -> None:
        """Wait (at most ``timeout``) for a worker told to close to end."""

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

    def send(self, worker: int, request: Request) -> None:
        w = self._live(worker)
        assert w.out is not None
        try:
            w.out.send_bytes(pickle.dumps(request, PROTOCOL))
        except OSError as exc:
            w.lost = True
            raise WorkerLost(f"{self.name} worker {worker}: {exc}") from exc

    def wait_fds(self, workers: Collection[int]) -> list[int] | None:
        fds = []
        for k in workers:
            w = self._workers[k]
            if w is None or w.lost or w.conn is None:
                return None
            fds.append(w.conn.fileno())
            if w.sentinel >= 0:
                fds.append(w.sentinel)
        return fds

    def wait(self, workers: Collection[int], timeout: float | None) -> list[int]:
        poller = select.poll()
        fds: dict[int, int] = {}
        sentinels: set[int] = set()
        dead: list[int] = []
        for k in workers:
            w = self._workers[k]
            if w is None or w.lost or w.conn is None:
                dead.append(k)
                continue
            fds[w.conn.fileno()] = k
            poller.register(w.conn.fileno(), select.POLLIN)
            if w.sentinel >= 0:
                fds[w.sentinel] = k
                sentinels.add(w.sentinel)
                poller.register(w.sentinel, select.POLLIN)
        if dead:
            return dead
        ms = None if timeout is None else max(0.0, timeout) * 1000.0
        ready: set[int] = set()
        for fd, _ in poller.poll(ms):
            ready.add(fds[fd])
            if fd in sentinels:
                self._exited.add(fds[fd])
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
