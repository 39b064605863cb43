"""process_pool backend: seed 001's ``ProcessPoolExecutor``, with env state resident in workers.

Seed 001 submits one task per env to a shared ``ProcessPoolExecutor``. A pool cannot route a task
to the process that holds env *i*, so that design ships the env with every task (64-72 µs per
env-step on 2 cores, far more for big envs). Here each worker is its own single-process
executor (``max_workers=1``) whose initializer builds that worker's slice of envs into a
process-global `EnvHost`. Every request for slice *k* goes to executor *k*, so it always finds
its envs, and one task per worker per step carries every env's actions: nothing but actions and
results crosses the process boundary.

Seed 001's knobs keep their meaning:

* ``max_workers`` (default ``min(8, cpu_count)``, never more than envs) is the worker count when
  ``num_workers`` is not given;
* ``sequential_env_types`` (names such as ``["webshop"]`` or entry points): those envs stay in
  the caller, stepped in order as the sequential backend would;
* "fallback to sequential on failure" is the pool's: `start` raises `BackendUnavailable`;
* "timeout protection": the pool waits with its ``step_timeout``; a worker past it (or one that
  died, which breaks its executor with ``BrokenProcessPool``) is killed and its executor rebuilt.

The helpers at the bottom (`ProgressSlot`, `watch_parent`) are shared with the joblib and Ray
backends, whose workers, like these, are not handed a pipe by turnpool at creation.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import mmap
import multiprocessing
import os
import struct
import tempfile
import threading
import time
from collections import deque
from collections.abc import Collection, Iterable, Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, ClassVar

from turnpool.backends import process as _process
from turnpool.backends.base import (
    Backend,
    BackendUnavailable,
    EnvBuild,
    EnvHost,
    Reply,
    Request,
    WorkerLost,
    short_error,
    split_evenly,
)
from turnpool.envs.registry import registered

log = logging.getLogger(__name__)

#: How long `close` lets workers close their envs before killing them.
CLOSE_GRACE_S = 2.0


def seed_default_workers(num_envs: int) -> int:
    """Seed 001's default: ``min(8, os.cpu_count())`` workers, and no more than envs."""
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


def _handle(request: Request) -> Reply:
    if _HOST is None:  # the initializer failed; the executor reports that as broken
        raise RuntimeError("worker has no envs")
    return _HOST.handle(request)


def _hello() -> int:
    return os.getpid()


# ------------------------------------------------------------------------- caller side
@dataclass
class _Worker:
    """One single-process executor and the requests in flight on it (oldest first)."""

    executor: cf.ProcessPoolExecutor
    progress: ProgressSlot
    pid: int = -1
    pending: deque[tuple[int, cf.Future[Reply]]] = field(default_factory=deque)
    lost: bool = False


class ProcessPoolBackend(Backend):
    """One ``ProcessPoolExecutor(max_workers=1)`` per worker; envs live in the executor's process.

    Options: ``max_workers`` (used when ``num_workers`` is None), ``sequential_env_types``.
    """

    name: ClassVar[str] = "process_pool"
    can_interrupt: ClassVar[bool] = True
    start_methods: ClassVar[tuple[str, ...]] = ("spawn", "forkserver", "fork")

    @staticmethod
    def default_num_workers(num_envs: int) -> int:
        return seed_default_workers(num_envs)

    def __init__(self, builds: Sequence[EnvBuild], num_workers: int | None = None, *,
                 mp_context: str | None = None, max_workers: int | None = None,
                 sequential_env_types: Sequence[str] | None = None, **options: Any) -> None:
        super().__init__(builds, num_workers or max_workers, mp_context=mp_context, **options)
        local_types = list(sequential_env_types or [])
        local_ids = [b.env_id for b in self.builds if env_type_matches(b, local_types)]
        if local_ids:
            remote_ids = [b.env_id for b in self.builds if b.env_id not in set(local_ids)]
            workers = num_workers or max_workers or self.default_num_workers(len(remote_ids))
            self.slices = [s for s in split_evenly(remote_ids, workers) if s] + [local_ids]
        #: worker index -> in-caller host (sequential_env_types)
        self._local: dict[int, EnvHost] = {}
        self._local_replies: dict[int, deque[Reply]] = {}
        self._local_slot = len(self.slices) - 1 if local_ids else None
        self._workers: dict[int, _Worker] = {}
        self._start_timeout = 60.0
        self._closed = False

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float) -> None:
        self._start_timeout = timeout
        try:
            self._ctx = multiprocessing.get_context(self.mp_context)
        except ValueError as exc:
            raise BackendUnavailable(f"start method {self.mp_context!r}: {exc}") from exc
        if self._local_slot is not None:
            self._local[self._local_slot] = EnvHost(self.builds_of(self._local_slot))
            self._local_replies[self._local_slot] = deque()
        remote = [k for k in range(self.num_workers) if k != self._local_slot]
        try:
            hellos = {}
            for k in remote:  # every process starts before any is waited for
                self._workers[k] = self._launch(k)
                hellos[k] = self._workers[k].executor.submit(_hello)
            deadline = time.monotonic() + timeout
            for k in remote:
                self._greet(k, hellos[k], max(0.1, deadline - time.monotonic()))
        except (OSError, RuntimeError, BrokenProcessPool, cf.TimeoutError) as exc:
            self.close()
            raise BackendUnavailable(f"process_pool workers did not start: "
                                     f"{short_error(exc)}") from exc

    def _launch(self, k: int) -> _Worker:
        progress = ProgressSlot()
        executor = cf.ProcessPoolExecutor(
            max_workers=1, mp_context=self._ctx, initializer=_init_worker,
            initargs=(self.builds_of(k), progress.path, os.getpid(),
                      threading.current_thread() is threading.main_thread()))
        return _Worker(executor, progress)

    def _greet(self, k: int, hello: cf.Future[int], timeout: float) -> None:
        """Wait until worker ``k`` has built its envs; then its progress file can go."""
        worker = self._workers[k]
        worker.pid = hello.result(timeout=timeout)
        worker.progress.unlink()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for host in self._local.values():
            host.close()
        self._local.clear()
        workers = list(self._workers.values())
        self._workers.clear()
        closing: dict[int, cf.Future[Reply]] = {}
        for i, w in enumerate(workers):
            if not w.lost:
                with contextlib.suppress(RuntimeError, BrokenProcessPool):
                    closing[i] = w.executor.submit(_handle, (-1, "close", None))
        if closing:
            cf.wait(list(closing.values()), timeout=CLOSE_GRACE_S)
        for i, w in enumerate(workers):
            fut = closing.get(i)
            if fut is None or not fut.done():  # dead, or stuck in env code
                _kill_executor(w.executor)
            w.executor.shutdown(wait=True, cancel_futures=True)
            w.progress.close()

    # ------------------------------------------------------------------ requests
    def send(self, worker: int, request: Request) -> None:
        host = self._local.get(worker)
        if host is not None:
            self._local_replies[worker].append(host.handle(request))
            return
        w = self._workers[worker]
        try:
            w.pending.append((request[0], w.executor.submit(_handle, request)))
        except (RuntimeError, BrokenProcessPool):  # broken (worker died) or shut down
            w.lost = True

    def _ready(self, worker: int) -> bool:
        if worker in self._local:
            return bool(self._local_replies[worker])
        w = self._workers[worker]
        return w.lost or bool(w.pending and w.pending[0][1].done())

    def wait(self, workers: Collection[int], timeout: float | None) -> list[int]:
        ready = [k for k in workers if self._ready(k)]
        if ready or timeout == 0:
            return ready
        heads = [self._workers[k].pending[0][1] for k in workers
                 if k in self._workers and self._workers[k].pending]
        if heads:
            cf.wait(heads, timeout=timeout, return_when=cf.FIRST_COMPLETED)
        return [k for k in workers if self._ready(k)]

    def recv(self, worker: int) -> Reply:
        if worker in self._local:
            return self._local_replies[worker].popleft()
        w = self._workers[worker]
        if w.lost or not w.pending:
            raise WorkerLost(f"process_pool worker {worker} is gone")
        seq, fut = w.pending.popleft()
        try:
            reply: Reply = fut.result(timeout=self._start_timeout)
        except (BrokenProcessPool, cf.CancelledError) as exc:
            w.lost = True
            raise WorkerLost(f"process_pool worker {worker} died: {short_error(exc)}") from exc
        except cf.TimeoutError as exc:
            raise WorkerLost(f"process_pool worker {worker} did not reply") from exc
        except Exception as exc:  # request or reply could not be pickled: the host is fine
            return (seq, None, short_error(exc))
        return reply

    def progress(self, worker: int) -> tuple[int, float] | None:
        w = self._workers.get(worker)
        return None if w is None else w.progress.read()

    def restart(self, worker: int) -> None:
        if worker in self._local:
            self._local[worker].close()
            self._local[worker] = EnvHost(self.builds_of(worker))
            self._local_replies[worker].clear()
            return
        old = self._workers[worker]
        _kill_executor(old.executor)
        old.executor.shutdown(wait=True, cancel_futures=True)
        old.progress.close()
        self._workers[worker] = new = self._launch(worker)
        try:
            self._greet(worker, new.executor.submit(_hello), self._start_timeout)
        except (OSError, RuntimeError, BrokenProcessPool, cf.TimeoutError) as exc:
            self._workers[worker].lost = True
            log.warning("process_pool worker %d did not restart: %s", worker, short_error(exc))

    def worker_pids(self) -> list[int]:
        return [w.pid for w in self._workers.values() if w.pid > 0]


def _kill_executor(executor: cf.ProcessPoolExecutor) -> None:
    # The executor offers no way to stop a process that is stuck in a task; its process table
    # is the only handle that cannot outlive the process (a bare pid could be reused).
    for proc in list((getattr(executor, "_processes", None) or {}).values()):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            proc.kill()


# -------------------------------------------------- helpers shared by pool-style backends
_SLOT = struct.Struct("<qd")  # env_id, time.monotonic() of its start


class ProgressSlot:
    """A 16-byte shared record ``(env_id, since)`` that a worker in any process on this host
    writes before each env and the caller reads when the worker dies or stalls.

    It is a small file in ``/dev/shm`` (or the temp dir) that the worker opens by path; the
    caller removes the name as soon as the worker has mapped it (`unlink`), so nothing stays
    behind even if the caller is killed later.
    """

    def __init__(self) -> None:
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, self.path = tempfile.mkstemp(prefix="turnpool-progress-", dir=folder)
        try:
            os.ftruncate(fd, _SLOT.size)
            self._map: mmap.mmap | None = mmap.mmap(fd, _SLOT.size)
        finally:
            os.close(fd)
        _SLOT.pack_into(self._map, 0, -1, time.monotonic())

    def read(self) -> tuple[int, float] | None:
        if self._map is None:
            return None
        env_id, since = _SLOT.unpack_from(self._map, 0)
        return int(env_id), float(since)

    def unlink(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def close(self) -> None:
        self.unlink()
        if self._map is not None:
            self._map.close()
            self._map = None


class ProgressWriter:
    """The worker's end of a `ProgressSlot`; a no-op where the file is not visible (another
    host), because progress is a diagnosis aid, not a requirement."""

    def __init__(self, path: str | None) -> None:
        self._map: mmap.mmap | None = None
        if path:
            try:
                fd = os.open(path, os.O_RDWR)
            except OSError:
                return
            try:
                self._map = mmap.mmap(fd, _SLOT.size)
            finally:
                os.close(fd)

    def __call__(self, env_id: int) -> None:
        if self._map is not None:
            _SLOT.pack_into(self._map, 0, env_id, time.monotonic())


_WATCHING = False


def watch_parent(parent_pid: int, die_with_parent: bool = False) -> None:
    """End this worker process soon after the process that owns the pool dies.

    Uses the process backend's watchdog (a thread that exits when this process is re-parented)
    and, when the caller spawned us from its main thread, Linux's parent-death signal. Does
    nothing in the owner itself (a joblib ``threading`` worker runs there).
    """
    global _WATCHING
    if _WATCHING or os.getpid() == parent_pid:
        return
    _WATCHING = True
    if die_with_parent:
        _process._die_with_parent()
    threading.Thread(target=_process._watch_parent, args=(os.getppid(),),
                     name="turnpool-parent-watch", daemon=True).start()


__all__ = ["ProcessPoolBackend", "ProgressSlot", "ProgressWriter", "env_type_matches",
           "seed_default_workers", "watch_parent"]
