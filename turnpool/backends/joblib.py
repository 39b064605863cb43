"""joblib backend: ``Parallel(n_jobs=...)`` workers, env state kept in the workers.

joblib runs stateless tasks and cannot send a task to the worker that holds env *i*; a design
that calls ``Parallel`` per step ships envs (or rebuilds them) per call and pays joblib's
result-polling floor on every step. Here each turnpool worker is **one joblib task that
lives as long as the pool**: it builds its slice of envs, connects back to the pool over a
private local socket (Linux abstract namespace, no file; the first bytes must be a random token
before anything is unpickled) and serves requests there, one message per worker per step, like
the process backend. joblib chooses and manages the processes or threads
(``joblib_backend``: ``"loky"`` (default), ``"multiprocessing"`` or ``"threading"``;
``n_jobs=-1`` means one worker per core, joblib's rule), and no joblib call happens per step.

All slices are launched by one ``Parallel`` call at start; a slice restarted after a fault is
launched by a new one-task call. Each call runs in a daemon thread until its tasks return.

Faults, per joblib flavour:

* ``loky``: when one worker dies (an env calling ``os._exit``, or a hung worker that turnpool
  kills), loky declares its executor broken and terminates *all* its workers. Every slice then
  reports lost, and the pool rebuilds the innocent envs by reset + replay, so results stay
  exact; that step just costs more.
* ``multiprocessing``: joblib never returns from a call whose worker died (it waits for the
  lost result); turnpool relaunches the slice and, at close, stops that stuck call.
* ``threading``: like the thread backend, a hung thread cannot be stopped (it is abandoned) and
  an env that ends the process ends the caller.

Limits: loky's executor is shared by the whole process and resized only when idle, so two
joblib/loky pools alive at once need the same ``num_workers`` (a second pool that cannot get
workers fails to start with `BackendUnavailable`, or runs sequentially with
``fallback=True``). ``mp_context`` is ignored: joblib picks the start method of its own
backends.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import pickle
import secrets
import signal
import socket
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection
from multiprocessing.connection import wait as wait_connections
from typing import Any, ClassVar

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
from turnpool.worker.host import EnvHost
from turnpool.worker.protocol import Op, Reply, Request
from turnpool.worker.transport import (
    CLOSE_GRACE_S,
    PROTOCOL,
    ProgressSlot,
    ProgressWriter,
    serve,
    watch_parent,
)

log = logging.getLogger(__name__)

JOBLIB_BACKENDS = ("loky", "multiprocessing", "threading")
_INTERRUPT_GRACE_S = 1.0
_BROKEN_EXECUTOR_WAIT_S = 15.0
_TOKEN_BYTES = 32


def resolve_n_jobs(n_jobs: int, num_envs: int) -> int:
    """joblib's ``n_jobs`` rule: ``-1`` all cores, ``-2`` all but one, ..., never more than
    envs."""
    if n_jobs == 0:
        raise ValueError("n_jobs == 0 has no meaning")
    if n_jobs < 0:
        import joblib

        n_jobs = max(1, joblib.cpu_count() + 1 + n_jobs)
    return max(1, min(n_jobs, num_envs))


# ------------------------------------------------------------------- worker (joblib task)
#: progress value a task writes when it has returned (its process is free again)
_FINISHED = -2
_INTERRUPT = signal.SIGUSR1


class _Interrupted(BaseException):
    """Raised in a task by the pool's interrupt signal; not an ``Exception``, so env-level
    handlers do not swallow it and the task unwinds and returns."""


def _on_interrupt(signum: int, frame: Any) -> None:
    signal.signal(_INTERRUPT, signal.SIG_IGN)  # once; a late second signal is harmless
    raise _Interrupted()


def serve_slice(address: str, token: bytes, worker: int, incarnation: int,
                builds: list[EnvBuild], progress_path: str, owner_pid: int) -> int:
    """One joblib task = one turnpool worker: build the envs, then answer requests until the
    pool closes the connection. Returns the worker index (joblib's result, unused).

    A stuck task is stopped with a signal rather than by killing its process: killing a loky
    worker makes loky terminate every other worker (every other slice) too.
    """
    in_process = os.getpid() != owner_pid
    if in_process:
        watch_parent(owner_pid)
        if threading.current_thread() is threading.main_thread():
            signal.signal(_INTERRUPT, _on_interrupt)
    progress = ProgressWriter(progress_path)
    conn = None
    try:
        conn = Client(address, family="AF_UNIX")
        conn.send_bytes(token)
        host = EnvHost(builds, progress)
        conn.send_bytes(pickle.dumps(("hello", worker, incarnation, os.getpid(),
                                      host.build_errors), PROTOCOL))
        serve(conn.recv_bytes, conn.send_bytes, host)
    except (EOFError, OSError, _Interrupted):
        pass
    finally:
        if in_process and threading.current_thread() is threading.main_thread():
            signal.signal(_INTERRUPT, signal.SIG_IGN)  # the process goes on serving joblib
        if conn is not None:
            conn.close()
        progress(_FINISHED)
    return worker


# ------------------------------------------------------------------------- caller side
class _Launch:
    """One ``Parallel`` call running a few long-lived slice tasks in a daemon thread."""

    def __init__(self, flavour: str, n_jobs: int, tasks: list[Any], epoch: int = 0) -> None:
        self.flavour = flavour
        self.epoch = epoch  # which loky executor generation it runs on
        self.parallel: Any = None
        self.thread = threading.Thread(target=self._run, args=(n_jobs, tasks),
                                       name="turnpool-joblib-launch", daemon=True)
        self.thread.start()

    def _run(self, n_jobs: int, tasks: list[Any]) -> None:
        from joblib import Parallel

        try:
            self.parallel = Parallel(n_jobs=n_jobs, backend=self.flavour, pre_dispatch="all",
                                     batch_size=1)
            with self.parallel:
                self.parallel(tasks)
        except Exception as exc:  # a worker died (loky) or the call was stopped at close
            log.debug("joblib launch ended: %s", short_error(exc))

    def stop(self, timeout: float) -> None:
        """Wait for the call to return; stop it if a lost task would keep it waiting."""
        self.thread.join(timeout)
        if self.thread.is_alive() and self.parallel is not None:
            # joblib has no public way to end a call whose worker vanished (multiprocessing)
            # or whose thread is stuck in env code (threading); its retrieval loop exits when
            # this flag is set and then terminates its own pool.
            self.parallel._aborting = True
            self.thread.join(timeout)
        if self.thread.is_alive():
            log.warning("a joblib call did not stop; its daemon thread is left behind")


@dataclass(eq=False, kw_only=True)
class _Task(WorkerHandle):
    """A long-running joblib task serving one slice: the pipe it talks over, and which start
    of the slot it is (a task of an older incarnation is ignored)."""

    conn: Connection | None
    incarnation: int = 0


class JoblibBackend(Backend):
    """Slices served by long-lived joblib tasks (see the module docstring).

    Options: ``n_jobs`` (joblib's worker count, used when ``num_workers`` is None;
    default -1 = one per core) and ``joblib_backend`` (``loky``, ``multiprocessing``,
    ``threading``).
    """

    name: ClassVar[str] = "joblib"

    @staticmethod
    def default_num_workers(num_envs: int) -> int:
        return resolve_n_jobs(-1, num_envs)

    def __init__(self, builds: Sequence[EnvBuild], num_workers: int | None = None, *,
                 mp_context: str | None = None, n_jobs: int | None = None,
                 joblib_backend: str = "loky", **options: Any) -> None:
        if num_workers is None and n_jobs is not None:
            num_workers = resolve_n_jobs(n_jobs, len(builds))
        super().__init__(builds, num_workers, mp_context=mp_context, **options)
        if joblib_backend not in JOBLIB_BACKENDS:
            raise ValueError(f"joblib_backend must be one of {JOBLIB_BACKENDS}, "
                             f"got {joblib_backend!r}")
        self.flavour = joblib_backend
        self._workers: list[_Task | None] = [None] * self.num_workers
        self._launches: list[_Launch] = []
        self._sock: socket.socket | None = None
        self._token = secrets.token_bytes(_TOKEN_BYTES)
        self._address = "\0turnpool-joblib-" + secrets.token_hex(12)
        self._early: dict[tuple[int, int], tuple[Connection, int, dict[int, str]]] = {}
        self._timeout = 60.0
        self._closed = False
        self._owner_pid = os.getpid()
        self._stuck_call = False
        #: loky: the executor generation, and the one each worker's task was launched on
        self._epoch = 0
        self._epoch_of: dict[int, int] = {}

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float) -> None:
        self._timeout = timeout
        try:
            require("joblib", feature="the joblib backend", extra="joblib")
        except MissingExtra as exc:
            raise BackendUnavailable(str(exc)) from exc
        progress: list[ProgressSlot] = []
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(self._address)
            sock.listen(max(8, self.num_workers))
            self._sock = sock
            progress = [ProgressSlot() for _ in range(self.num_workers)]
            launch = self._launch(list(range(self.num_workers)), progress, incarnation=0)
            deadline = time.monotonic() + timeout
            for k in range(self.num_workers):
                self._await_worker(k, 0, progress[k], deadline, launch)
        except EnvBuildError:  # the envs are broken, not the backend
            self.close()
            for slot in progress:
                slot.close()
            raise
        except (OSError, TimeoutError, WorkerLost, ValueError) as exc:
            self.close()
            for slot in progress:  # those of workers that never connected
                slot.close()
            raise BackendUnavailable(f"joblib ({self.flavour}) workers did not start: "
                                     f"{short_error(exc)}") from exc

    def _launch(self, slots: list[int], progress: list[ProgressSlot], incarnation: int
                ) -> _Launch:
        from joblib import delayed

        tasks = [delayed(serve_slice)(self._address, self._token, k, incarnation,
                                      self.builds_of(k), p.path, self._owner_pid)
                 for k, p in zip(slots, progress)]
        if self.flavour == "loky":
            # loky's executor is process-wide and only resized when idle: every call asks for
            # the same size, and at least 2 (n_jobs=1 would run the task in the launch thread).
            n_jobs = max(2, self.num_workers)
        elif self.flavour == "multiprocessing":
            n_jobs = max(2, len(tasks))
        else:
            n_jobs = max(1, len(tasks))
        launch = _Launch(self.flavour, n_jobs, tasks, self._epoch)
        for k in slots:
            self._epoch_of[k] = self._epoch
        self._launches.append(launch)
        return launch

    def _await_worker(self, k: int, incarnation: int, progress: ProgressSlot,
                      deadline: float, launch: _Launch) -> None:
        """Accept connections until worker ``k`` (this incarnation) has said hello."""
        while (k, incarnation) not in self._early:
            left = deadline - time.monotonic()
            if left <= 0 or not launch.thread.is_alive():
                progress.close()
                why = "in time" if left <= 0 else "(its joblib call ended first)"
                raise TimeoutError(f"joblib worker {k} did not connect {why}")
            assert self._sock is not None
            # Short slices: a joblib call that fails (e.g. on a broken loky executor) is
            # noticed within a fraction of a second instead of at the deadline.
            self._sock.settimeout(min(left, 0.2))
            try:
                client, _ = self._sock.accept()
            except TimeoutError:
                continue
            client.settimeout(None)
            conn = Connection(client.detach())
            try:
                hello = self._handshake(conn, deadline)
            except (OSError, EOFError, TimeoutError, ValueError) as exc:
                log.warning("rejected a connection on the joblib socket: %s", exc)
                conn.close()
                continue
            _, worker, inc, pid, errors = hello
            self._early[(int(worker), int(inc))] = (conn, int(pid), dict(errors))
        conn, pid, errors = self._early.pop((k, incarnation))
        progress.unlink()
        self._workers[k] = _Task(progress=progress, conn=conn, pid=pid, incarnation=incarnation)
        raise_build_errors(errors)

    def _handshake(self, conn: Connection, deadline: float) -> tuple[Any, ...]:
        if not conn.poll(max(0.0, deadline - time.monotonic())):
            raise TimeoutError("no token")
        if not hmac.compare_digest(conn.recv_bytes(maxlength=_TOKEN_BYTES), self._token):
            raise ValueError("bad token")
        # Envs are built between token and hello; the worker is ours, so its pickles are trusted.
        if not conn.poll(max(0.0, deadline - time.monotonic())):
            raise TimeoutError("no hello")
        hello = pickle.loads(conn.recv_bytes())
        if not (isinstance(hello, tuple) and len(hello) == 5 and hello[0] == "hello"):
            raise ValueError("bad hello")
        return hello

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        workers = [w for w in self._workers if w is not None]
        self._workers = [None] * len(self._workers)
        for conn, _pid, _errors in self._early.values():
            conn.close()
        self._early.clear()
        if os.getpid() != self._owner_pid:  # a forked copy of the owner: not ours to stop
            return
        bye = pickle.dumps((0, Op.CLOSE, None), PROTOCOL)
        for w in workers:
            if w.conn is not None and not w.lost:
                with contextlib.suppress(OSError):
                    w.conn.send_bytes(bye)
        # A call with a lost (multiprocessing) or abandoned (threading) task never returns.
        grace = 0.1 if self._stuck_call else CLOSE_GRACE_S
        deadline = time.monotonic() + grace
        for launch in self._launches:
            launch.thread.join(max(0.0, deadline - time.monotonic()))
        for w in workers:
            if w.conn is not None:
                w.conn.close()
            mark = w.progress.read()
            if not w.lost and mark is not None and mark[0] != _FINISHED:
                self._stop_task(w)  # still in env code after the grace period
            w.progress.close()
        for launch in self._launches:
            launch.stop(grace)
        self._launches.clear()
        if self.flavour == "loky":
            _shutdown_loky(CLOSE_GRACE_S)
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _kill(self, pid: int) -> None:
        if pid <= 0 or pid == self._owner_pid:
            return  # a thread worker: cannot be killed
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)

    def _stop_task(self, w: _Task) -> None:
        """End a worker's task: interrupt it, and kill its process only if it does not return
        (env code stuck in C); a thread worker can only be abandoned."""
        if w.pid <= 0 or w.pid == self._owner_pid:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(w.pid, _INTERRUPT)
        deadline = time.monotonic() + _INTERRUPT_GRACE_S
        while time.monotonic() < deadline:
            mark = w.progress.read()
            if mark is None or mark[0] == _FINISHED:
                return
            time.sleep(0.005)  # bounded, only while a stuck worker is being replaced
        log.warning("joblib worker pid %d ignored the interrupt; killing it", w.pid)
        self._kill(w.pid)

    # ------------------------------------------------------------------ protocol
    def send(self, worker: int, request: Request) -> None:
        w = self._workers[worker]
        if w is None or w.lost or w.conn is None:
            raise WorkerLost("joblib worker is gone")
        try:
            w.conn.send_bytes(pickle.dumps(request, PROTOCOL))
        except OSError as exc:
            w.lost = True
            raise WorkerLost(f"joblib worker {worker}: {exc}") from exc

    def wait(self, workers: Collection[int], timeout: float | None) -> list[int]:
        conns: dict[Any, int] = {}
        dead: list[int] = []
        for k in workers:
            w = self._workers[k]
            if w is None or w.lost or w.conn is None:
                dead.append(k)
            else:
                conns[w.conn] = k
        if dead:
            return dead
        ready = wait_connections(list(conns), timeout)
        return sorted(conns[c] for c in ready)

    def recv(self, worker: int) -> Reply:
        w = self._workers[worker]
        if w is None or w.lost or w.conn is None:
            raise WorkerLost("joblib worker is gone")
        try:
            reply: Reply = pickle.loads(w.conn.recv_bytes())
        except (EOFError, OSError) as exc:
            w.lost = True
            raise WorkerLost(f"joblib worker {worker} ({self.flavour}) died") from exc
        return reply

    def progress(self, worker: int) -> tuple[int, float] | None:
        w = self._workers[worker]
        return None if w is None else w.read_progress()

    def restart(self, worker: int) -> None:
        old = self._workers[worker]
        incarnation = 1
        if old is not None:
            incarnation = old.incarnation + 1
            if old.conn is not None:
                old.conn.close()  # a thread worker that ever returns sees EOF and exits
            if not old.lost:
                self._stop_task(old)
            self._stuck_call |= (old.pid == self._owner_pid
                                 or (old.lost and self.flavour == "multiprocessing"))
            old.progress.close()
            if old.lost and self.flavour == "loky":
                self._await_broken_executor(worker)
        self._workers[worker] = None
        deadline = time.monotonic() + self._timeout
        for attempt in range(2):  # a call may land on a loky executor that is still dying
            progress = ProgressSlot()
            launch = self._launch([worker], [progress], incarnation + attempt)
            try:
                self._await_worker(worker, incarnation + attempt, progress, deadline, launch)
                return
            except (OSError, TimeoutError, EnvBuildError) as exc:
                error = exc
        raise WorkerLost(f"joblib worker {worker} did not restart: {error}")

    def _await_broken_executor(self, worker: int) -> None:
        """A loky worker died, so loky is terminating its whole executor (every other slice
        on it dies too; the pool restores their envs as it finds them lost). Each call that
        ran on it aborts and, on the way out, terminates whatever executor is current: a slice
        launched before those calls have ended would be killed with them. So the first
        restart after a break waits for them; restarts of slices that died with it launch at
        once on the new executor."""
        if self._epoch_of.get(worker, self._epoch) != self._epoch:
            return  # died with an executor that is already replaced
        ending = [launch for launch in self._launches
                  if launch.epoch == self._epoch and launch.thread.is_alive()]
        deadline = time.monotonic() + _BROKEN_EXECUTOR_WAIT_S
        for launch in ending:
            launch.thread.join(max(0.0, deadline - time.monotonic()))
        self._epoch += 1

    def worker_pids(self) -> list[int]:
        return [w.pid for w in self._workers
                if w is not None and w.pid != self._owner_pid]


def _shutdown_loky(timeout: float) -> None:
    """Stop loky's process-wide executor now that our tasks have returned.

    loky keeps idle workers for minutes for the next call; they are processes the pool
    started, and none may outlive it. Killing them instead would break the executor under the
    next call. joblib exposes no handle to the executor, hence loky's module global.
    """
    from joblib.externals.loky import reusable_executor

    executor = reusable_executor._executor  # None until loky's first call, and after shutdown
    if executor is None:
        return
    done = threading.Thread(target=executor.shutdown, kwargs={"wait": True}, daemon=True,
                            name="turnpool-loky-shutdown")
    done.start()
    done.join(timeout)
    if done.is_alive():  # someone else's loky tasks are still running
        log.warning("loky's executor is busy with other work; its workers stay for it")


__all__ = ["JOBLIB_BACKENDS", "JoblibBackend", "resolve_n_jobs", "serve_slice"]
