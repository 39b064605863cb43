"""process_pool backend: a ``ProcessPoolExecutor`` per worker, with env state resident in it.

A task pool cannot route a task to the process that holds env *i*, so a design that submits one
task per env to a shared ``ProcessPoolExecutor`` ships the env with every task. Here each worker
is its own single-process executor (``max_workers=1``) running **one task that lives as long as
the pool**: it builds that worker's slice of envs, dials back to the pool over a private local
socket (`turnpool.backends.remote.Rendezvous`) and serves requests there with the request loop
every worker runs (`turnpool.worker.handoff.HandoffServer`; ``handoff_after`` turns hand-off
on, off by default here). One message per worker per step carries every env's actions: nothing
but actions and results crosses the process boundary, and no executor call happens per step.
The lifecycle (handshake, restart, close) is `turnpool.backends.remote.RemoteBackend`'s.

The executor-style knobs:

* ``max_workers`` (default ``min(8, cpu_count)``, never more than envs) is the worker count when
  ``num_workers`` is not given;
* ``sequential_env_types`` (names such as ``["webshop"]`` or entry points): those envs stay in
  the caller, in one more worker whose `EnvHost` answers each request as it is sent (the
  sequential backend's path), so they are stepped in order;
* "fallback to sequential on failure" is the pool's: `start` raises `BackendUnavailable`, and
  `turnpool.backends.start_backend` runs sequentially instead when asked (``fallback=True``);
* "timeout protection": the pool waits with its ``step_timeout``; a worker past it (or one that
  died, which ends its connection) is killed and its executor rebuilt.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import multiprocessing
import os
import threading
from collections import deque
from collections.abc import Collection, Iterable, Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, ClassVar

from turnpool.backends.remote import (
    Hello,
    Rendezvous,
    Stream,
    StreamBackend,
    WorkerInit,
    dial_and_serve,
)
from turnpool.envs.registry import registered
from turnpool.worker.build import EnvBuild, split_evenly
from turnpool.worker.host import EnvHost
from turnpool.worker.protocol import Reply, Request
from turnpool.worker.transport import CLOSE_GRACE_S, ProgressSlot, watch_parent

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


def _serve_slice(address: str, token: bytes, init: WorkerInit, parent_pid: int,
                 die_with_parent: bool) -> None:
    """The executor's one long task: a worker for the pool's life."""
    watch_parent(parent_pid, die_with_parent)
    dial_and_serve(address, token, init)


# ------------------------------------------------------------------------- caller side
@dataclass(eq=False, kw_only=True)
class _Executor(Stream):
    """A one-process executor and its long task (``runner``: the executor, ``task``: the
    task's future), or, for the ``sequential_env_types`` slice, an `EnvHost` in the caller
    (``runner``) whose replies wait in ``answered``."""

    runner: Any
    task: Any = None
    answered: deque[Reply] = field(default_factory=deque)


class ProcessPoolBackend(StreamBackend[_Executor]):
    """One ``ProcessPoolExecutor(max_workers=1)`` per worker; envs live in the executor's process.

    Options: ``max_workers`` (used when ``num_workers`` is None), ``sequential_env_types``,
    ``handoff_after``.
    """

    name: ClassVar[str] = "process_pool"
    start_methods: ClassVar[tuple[str, ...]] = ("spawn", "forkserver", "fork")
    start_errors = (*StreamBackend.start_errors, RuntimeError, BrokenProcessPool)

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
            self._workers = [None] * self.num_workers
            self._incarnations = [0] * self.num_workers
        self._rendezvous = Rendezvous("process-pool")
        self._ctx: Any = None

    def _prepare(self) -> None:
        try:
            self._ctx = multiprocessing.get_context(self.mp_context)
        except ValueError as exc:
            raise ValueError(f"start method {self.mp_context!r}: {exc}") from exc
        self._rendezvous.open(self.num_workers)

    # ------------------------------------------------------------------ a worker's start
    def _launch(self, slot: int | None) -> _Executor:
        assert slot is not None  # no standby: an idle executor would be a process too
        progress = ProgressSlot()
        init = self._init(slot, progress)
        if slot == self._local_slot:
            progress.unlink()  # written in this process only
            return _Executor(runner=EnvHost(init.builds, progress.write), progress=progress)
        executor = cf.ProcessPoolExecutor(max_workers=1, mp_context=self._ctx)
        worker = _Executor(runner=executor, progress=progress)
        worker.task = executor.submit(_serve_slice, self._rendezvous.address,
                                      self._rendezvous.token, init, os.getpid(),
                                      threading.current_thread() is threading.main_thread())
        return worker

    def _await_hello(self, worker: _Executor, slot: int, deadline: float) -> Hello:
        if isinstance(worker.runner, EnvHost):
            return Hello(slot, self._incarnations[slot], os.getpid(),
                         dict(worker.runner.build_errors))
        try:
            conn, hello = self._rendezvous.accept(slot, self._incarnations[slot], deadline,
                                                  lambda: not worker.task.done())
        except TimeoutError:
            if worker.task.done():  # say why the task ended (a broken executor, ...)
                worker.task.result(timeout=0)
            raise
        worker.conn = worker.out = conn
        return hello

    # ------------------------------------------------------------------ a worker's end
    def _shutdown(self, workers: list[_Executor]) -> None:
        self._say_close(workers)
        tasks = [w.task for w in workers if w.task is not None]
        if tasks:
            cf.wait(tasks, timeout=CLOSE_GRACE_S)
        for w in workers:
            self._stop(w)

    def _stop(self, worker: _Executor) -> None:
        worker.lost = True
        if isinstance(worker.runner, EnvHost):
            worker.runner.close()
        else:
            if worker.task is None or not worker.task.done():  # dead, or stuck in env code
                _kill_executor(worker.runner)
            worker.close_pipes()
            worker.runner.shutdown(wait=True, cancel_futures=True)
        worker.progress.close()

    def _release(self) -> None:
        self._rendezvous.close()

    # ------------------------------------------------------------------ requests
    def send(self, worker: int, request: Request) -> None:
        w = self._live(worker)
        if isinstance(w.runner, EnvHost):
            w.answered.append(w.runner.handle(request))
        else:
            super().send(worker, request)

    def wait(self, workers: Collection[int], timeout: float | None) -> list[int]:
        local = [k for k in workers if k == self._local_slot]
        remote = [k for k in workers if k != self._local_slot]
        ready = [k for k in local if self._local_ready(k)]
        if remote:
            ready += super().wait(remote, 0.0 if ready else timeout)
        return sorted(ready)

    def _local_ready(self, worker: int) -> bool:
        w = self._workers[worker]
        return w is None or w.lost or bool(w.answered)

    def recv(self, worker: int) -> Reply:
        if worker != self._local_slot:
            return super().recv(worker)
        return self._live(worker).answered.popleft()

    def _death(self, worker: int, w: _Executor) -> str:
        return f"process_pool worker {worker} died"


def _kill_executor(executor: cf.ProcessPoolExecutor) -> None:
    # The executor offers no way to stop a process that is stuck in a task; its process table
    # is the only handle that cannot outlive the process (a bare pid could be reused).
    for proc in list((executor._processes or {}).values()):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            proc.kill()


__all__ = ["ProcessPoolBackend", "default_max_workers", "env_type_matches"]
