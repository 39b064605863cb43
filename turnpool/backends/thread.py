"""Thread backend: worker threads in the caller's process, each owning a slice of envs.

For I/O-bound envs (web services, tools): a thread blocked on a socket releases the GIL, so
waits overlap, while CPU-bound Python envs gain nothing (use ``process``).

A thread cannot be killed. A thread stuck past ``step_timeout`` is abandoned (its replies are
ignored from then on) and a new thread with freshly built envs takes over its slice; the
abandoned thread gets `turnpool.worker.deadline.StepInterrupted` raised inside the env code
it is stuck in, so a Python-level hang unwinds and the thread exits (a hang inside one C call
ends only when that call returns). An env that ends the process (``os._exit``) ends the caller
too; use the process backend for envs that can crash.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Collection, Sequence
from typing import Any, ClassVar

from turnpool.backends.base import Backend, WorkerLost, raise_build_errors
from turnpool.worker.build import EnvBuild
from turnpool.worker.deadline import StepInterrupted, raise_in_thread
from turnpool.worker.errors import short_error
from turnpool.worker.host import EnvHost
from turnpool.worker.protocol import Reply, Request
from turnpool.worker.transport import CLOSE_GRACE_S, ProgressSlot

log = logging.getLogger(__name__)

_DEAD = object()  # a reply slot meaning "the thread died"


class _ThreadWorker:
    def __init__(self, backend: ThreadBackend, slot: int, builds: list[EnvBuild],
                 generation: int) -> None:
        self.backend = backend
        self.slot = slot
        self.generation = generation
        self.inbox: queue.SimpleQueue[Request | None] = queue.SimpleQueue()
        self.progress = ProgressSlot()
        self.progress.unlink()  # written and read in this process only
        self.host = EnvHost(builds, self.progress.write)
        self.thread = threading.Thread(target=self._loop, name=f"turnpool-env-{slot}",
                                       daemon=True)

    def _loop(self) -> None:
        try:
            while True:
                request = self.inbox.get()
                if request is None:
                    break
                try:
                    reply: Any = self.host.handle(request)
                except StepInterrupted:  # abandoned; whatever it answers is ignored
                    break
                except BaseException as exc:  # SystemExit from env code: the worker is gone
                    log.warning("env thread %d stopped: %s", self.slot, short_error(exc))
                    self.backend._post(self, _DEAD)
                    break
                self.backend._post(self, reply)
        except StepInterrupted:  # interrupted after it had come back by itself
            pass
        finally:
            self.host.close()


class ThreadBackend(Backend):
    """``num_workers`` threads (default ``min(16, num_envs)``)."""

    name: ClassVar[str] = "thread"

    @staticmethod
    def default_num_workers(num_envs: int) -> int:
        return max(1, min(16, num_envs))

    def __init__(self, builds: Sequence[EnvBuild], num_workers: int | None = None, *,
                 mp_context: str | None = None, **options: Any) -> None:
        super().__init__(builds, num_workers, mp_context=mp_context, **options)
        self._cond = threading.Condition()
        self._outbox: list[deque[Any]] = [deque() for _ in self.slices]
        self._workers: list[_ThreadWorker] = []
        self._closed = False
        #: threads stuck in env code and given up on (they exit if the code ever returns)
        self.abandoned = 0

    def start(self, timeout: float) -> None:
        """Start one thread per slice, each with its freshly built envs (envs that draw from
        the process-global RNG were refused at the choice, `choice.refuse_unsupported`)."""
        for k in range(self.num_workers):
            worker = _ThreadWorker(self, k, self.builds_of(k), 0)
            self._workers.append(worker)
            worker.thread.start()
        errors = {i: e for w in self._workers for i, e in w.host.build_errors.items()}
        if errors:
            self.close()
        raise_build_errors(errors)

    def _post(self, worker: _ThreadWorker, reply: Any) -> None:
        with self._cond:
            if self._workers and self._workers[worker.slot] is worker:
                self._outbox[worker.slot].append(reply)
                self._cond.notify_all()

    def send(self, worker: int, request: Request) -> None:
        self._workers[worker].inbox.put(request)

    def wait(self, workers: Collection[int], timeout: float | None) -> list[int]:
        outbox = self._outbox
        with self._cond:
            self._cond.wait_for(lambda: any(outbox[w] for w in workers), timeout)
            return [w for w in workers if outbox[w]]

    def recv(self, worker: int) -> Reply:
        with self._cond:
            reply = self._outbox[worker].popleft()
        if reply is _DEAD:
            raise WorkerLost("worker thread died")
        result: Reply = reply
        return result

    def progress(self, worker: int) -> tuple[int, float] | None:
        return self._workers[worker].progress.read() if self._workers else None

    def restart(self, worker: int) -> None:
        old = self._workers[worker]
        old.inbox.put(None)  # if it ever comes back, it exits
        if old.thread.ident is not None and old.thread.is_alive():
            raise_in_thread(old.thread.ident)  # unwinds a Python-level hang
            self.abandoned += 1
        new = _ThreadWorker(self, worker, self.builds_of(worker), old.generation + 1)
        with self._cond:
            self._workers[worker] = new
            self._outbox[worker].clear()
        new.thread.start()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        workers, self._workers = self._workers, []
        for w in workers:
            w.inbox.put(None)
        deadline = time.monotonic() + CLOSE_GRACE_S
        for w in workers:
            w.thread.join(max(0.0, deadline - time.monotonic()))
            if w.thread.is_alive():  # stuck in env code; it is a daemon thread
                log.warning("env thread %d is stuck and was abandoned", w.slot)
