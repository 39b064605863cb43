"""process_pool backend: a ``ProcessPoolExecutor`` per worker, with env state resident in it.

A task pool cannot route a task to the process that holds env *i*, so a design that submits one
task per env to a shared ``ProcessPoolExecutor`` ships the env with every task. Here each worker
is its own single-process executor (``max_workers=1``) whose initializer builds that worker's
slice of envs into a process-global `EnvHost`. Every request for slice *k* goes to executor *k*,
so it always finds its envs, and one task per worker per step carries every env's actions:
nothing but actions and results crosses the process boundary.

The executor-style knobs:

* ``max_workers`` (default ``min(8, cpu_count)``, never more than envs) is the worker count when
  ``num_workers`` is not given;
* ``sequential_env_types`` (names such as ``["webshop"]`` or entry points): those envs stay in
  the caller, in one more worker whose `EnvHost` answers each request as it is sent (the
  sequential backend's path), so they are stepped in order;
* "fallback to sequential on failure" is the pool's: `start` raises `BackendUnavailable`, and
  `turnpool.backends.start_backend` runs sequentially instead when asked (``fallback=True``);
* "timeout protection": the pool waits with its ``step_timeout``; a worker past it (or one that
  died, which breaks its executor with ``BrokenProcessPool``) is killed and its executor rebuilt.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import multiprocessing
import os
import pickle
import threading
import time
from collections import deque
from collections.abc import Collection, Iterable, Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, ClassVar

from turnpool.backends.base import (
    Backend,
    BackendUnavailable,
    EnvBuildError,
    WorkerHandle,
    WorkerLost,
    raise_build_errors,
)
from turnpool.envs.registry import registered
from turnpool.worker.build import EnvBuild, split_evenly
from turnpool.worker.errors import short_error
from turnpool.worker.host import EnvHost
from turnpool.worker.protocol import Op, Reply, Request
from turnpool.worker.transport import (
    CLOSE_GRACE_S,
    ProgressSlot,
    ProgressWriter,
    encode,
    watch_parent,
)

log = logging.getLogger(__name__)


def default_max_workers(num_envs: int) -> int:
    """The executor-style default: ``min(8, os.cpu_count())`` workers, and no more than envs."""
    return max(1, min(8, os.cpu_count() or 1, num_envs))


def env_type_matches(build: EnvBuild, names: Iterable[str]) -> bool:
    """Does ``build`` belong to one of ``names`` (registered names or entry points)?"""
    specs = registered()
    for name in names:
        spec = specs.get(name)
        if build.entry_point == name or (spec is not None and spec.entry_point ==
                                         build.entry_point):
            return True
    return False


# ------------------------------------------------------------------ worker process side
_HOST: EnvHost | None = None


def _init_worker(builds: list[EnvBuild], progress_path: str, parent_pid: int,
                 die_with_parent: bool) -> None:
    global _HOST
    watch_parent(parent_pid, die_with_parent)
    _HOST = EnvHost(builds, ProgressWriter(progress_path))


def _handle(request: bytes) -> bytes:
    if _HOST is None:  # the initializer failed; the executor reports that as broken
        raise RuntimeError("worker has no envs")
    return encode(_HOST.handle(pickle.loads(request)))


def _hello() -> tuple[int, dict[int, str]]:
    return os.getpid(), dict(_HOST.build_errors) if _HOST is not None else {}


# ------------------------------------------------------------------------- caller side
@dataclass(eq=False, kw_only=True)
class _Executor(WorkerHandle):
    """A one-process executor (or the `EnvHost` of the slice served in the caller) and its
    requests in flight ``(seq, op, future)``."""

    runner: Any
    pending: deque[tuple[int, Op, Any]] = field(default_factory=deque)


class ProcessPoolBackend(Backend):
    """One ``ProcessPoolExecutor(max_workers=1)`` per worker; envs live in the executor's process.

    A worker's ``runner`` is its executor, or, for the ``sequential_env_types`` slice, an
    `EnvHost` in the caller whose replies are futures completed at send time; either way
    ``pending`` holds the futures of the requests in flight, oldest first.

    Options: ``max_workers`` (used when ``num_workers`` is None), ``sequential_env_types``.
    """

    name: ClassVar[str] = "process_pool"
    start_methods: ClassVar[tuple[str, ...]] = ("spawn", "forkserver", "fork")

    @staticmethod
    def default_num_workers(num_envs: int) -> int:
        return default_max_workers(num_envs)

    def __init__(self, builds: Sequence[EnvBuild], num_workers: int | None = None, *,
                 mp_context: str | None = None, max_workers: int | None = None,
                 sequential_env_types: Sequence[str] | None = None, **options: Any) -> None:
        super().__init__(builds, num_workers or max_workers, mp_context=mp_context, **options)
        local_types = list(sequential_env_types or [])
        local_ids = [b.env_id for b in self.builds if env_type_matches(b, local_types)]
        #: the slot served in the caller (sequential_env_types), if any
        self._local_slot: int | None = None
        if local_ids:
            remote_ids = [b.env_id for b in self.builds if b.env_id not in set(local_ids)]
            workers = num_workers or max_workers or self.default_num_workers(len(remote_ids))
            self.slices = [s for s in split_evenly(remote_ids, workers) if s] + [local_ids]
            self._local_slot = len(self.slices) - 1
        self._workers: dict[int, _Executor] = {}
        self._start_timeout = 60.0
        self._closed = False

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float) -> None:
        self._start_timeout = timeout
        try:
            self._ctx = multiprocessing.get_context(self.mp_context)
        except ValueError as exc:
            raise BackendUnavailable(f"start method {self.mp_context!r}: {exc}") from exc
        remote = [k for k in range(self.num_workers) if k != self._local_slot]
        try:
            hellos = {}
            for k in remote:  # every process starts before any is waited for
                self._workers[k] = self._launch(k)
                hellos[k] = self._workers[k].runner.submit(_hello)
            if self._local_slot is not None:
                self._workers[self._local_slot] = self._launch_local(self._local_slot)
            deadline = time.monotonic() + timeout
            for k in remote:
                self._greet(k, hellos[k], max(0.1, deadline - time.monotonic()))
            if self._local_slot is not None:
                local = self._workers[self._local_slot].runner
                raise_build_errors(local.build_errors)
        except EnvBuildError:  # the envs are broken, not the backend
            self.close()
            raise
        except (OSError, RuntimeError, BrokenProcessPool, cf.TimeoutError) as exc:
            self.close()
            raise BackendUnavailable(f"process_pool workers did not start: "
                                     f"{short_error(exc)}") from exc

    def _launch(self, k: int) -> _Executor:
        progress = ProgressSlot()
        executor = cf.ProcessPoolExecutor(
            max_workers=1, mp_context=self._ctx, initializer=_init_worker,
            initargs=(self.builds_of(k), progress.path, os.getpid(),
                      threading.current_thread() is threading.main_thread()))
        return _Executor(runner=executor, progress=progress)

    def _launch_local(self, k: int) -> _Executor:
        progress = ProgressSlot()
        progress.unlink()  # written in this process only
        return _Executor(runner=EnvHost(self.builds_of(k), progress.write), progress=progress)

    def _greet(self, k: int, hello: cf.Future[tuple[int, dict[int, str]]],
               timeout: float) -> None:
        """Wait until worker ``k`` has built its envs; then its progress file can go."""
        worker = self._workers[k]
        worker.pid, errors = hello.result(timeout=timeout)
        worker.progress.unlink()
        raise_build_errors(errors)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        workers = list(self._workers.values())
        self._workers.clear()
        closing: dict[int, cf.Future[bytes]] = {}
        for i, w in enumerate(workers):
            if isinstance(w.runner, EnvHost):
                w.runner.close()
            elif not w.lost:
                with contextlib.suppress(RuntimeError, BrokenProcessPool):
                    closing[i] = w.runner.submit(_handle, pickle.dumps((-1, Op.CLOSE, None)))
        if closing:
            cf.wait(list(closing.values()), timeout=CLOSE_GRACE_S)
        for i, w in enumerate(workers):
            if not isinstance(w.runner, EnvHost):
                fut = closing.get(i)
                if fut is None or not fut.done():  # dead, or stuck in env code
                    _kill_executor(w.runner)
                w.runner.shutdown(wait=True, cancel_futures=True)
            w.progress.close()

    # ------------------------------------------------------------------ requests
    def send(self, worker: int, request: Request) -> None:
        w = self._workers[worker]
        if isinstance(w.runner, EnvHost):
            done: cf.Future[Reply] = cf.Future()
            done.set_result(w.runner.handle(request))
            w.pending.append((request[0], request[1], done))
            return
        # Pickled here, so that an action that cannot be pickled fails in the caller (and only
        # its env), not later in the executor's feeder thread.
        blob = pickle.dumps(request, pickle.HIGHEST_PROTOCOL)
        try:
            w.pending.append((request[0], request[1], w.runner.submit(_handle, blob)))
        except (RuntimeError, BrokenProcessPool):  # broken (worker died) or shut down
            w.lost = True

    def _ready(self, worker: int) -> bool:
        w = self._workers[worker]
        return w.lost or bool(w.pending and w.pending[0][2].done())

    def wait(self, workers: Collection[int], timeout: float | None) -> list[int]:
        ready = [k for k in workers if self._ready(k)]
        if ready or timeout == 0:
            return ready
        heads = [self._workers[k].pending[0][2] for k in workers
                 if k in self._workers and self._workers[k].pending]
        if heads:
            cf.wait(heads, timeout=timeout, return_when=cf.FIRST_COMPLETED)
        return [k for k in workers if self._ready(k)]

    def recv(self, worker: int) -> Reply:
        w = self._workers[worker]
        if w.lost or not w.pending:
            raise WorkerLost(f"process_pool worker {worker} is gone")
        seq, op, fut = w.pending.popleft()
        try:
            reply: Reply | bytes = fut.result(timeout=self._start_timeout)
        except (BrokenProcessPool, cf.CancelledError) as exc:
            w.lost = True
            raise WorkerLost(f"process_pool worker {worker} died: {short_error(exc)}") from exc
        except cf.TimeoutError as exc:
            raise WorkerLost(f"process_pool worker {worker} did not reply") from exc
        except Exception as exc:  # the request could not be pickled: the host is fine
            return (seq, op, None, "unpicklable", short_error(exc))
        # a remote worker's reply comes pickled (see `encode`), the caller's own as is
        return pickle.loads(reply) if isinstance(reply, bytes) else reply

    def progress(self, worker: int) -> tuple[int, float] | None:
        w = self._workers.get(worker)
        return None if w is None else w.read_progress()

    def restart(self, worker: int) -> None:
        old = self._workers[worker]
        if isinstance(old.runner, EnvHost):
            old.runner.close()
            old.progress.close()
            self._workers[worker] = self._launch_local(worker)
            return
        _kill_executor(old.runner)
        old.runner.shutdown(wait=True, cancel_futures=True)
        old.progress.close()
        self._workers[worker] = new = self._launch(worker)
        try:
            self._greet(worker, new.runner.submit(_hello), self._start_timeout)
        except (OSError, RuntimeError, BrokenProcessPool, cf.TimeoutError,
                EnvBuildError) as exc:
            new.lost = True
            log.warning("process_pool worker %d did not restart: %s", worker, short_error(exc))

    def worker_pids(self) -> list[int]:
        return [w.pid for w in self._workers.values() if w.pid > 0]


def _kill_executor(executor: cf.ProcessPoolExecutor) -> None:
    # The executor offers no way to stop a process that is stuck in a task; its process table
    # is the only handle that cannot outlive the process (a bare pid could be reused).
    for proc in list((executor._processes or {}).values()):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            proc.kill()


__all__ = ["ProcessPoolBackend", "default_max_workers", "env_type_matches"]
