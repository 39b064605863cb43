"""Sequential backend: every worker's `EnvHost` runs in the caller, one after the other.

The floor for microsecond envs (no hand-off at all) and the fallback when ``auto``'s choice, or
a backend started with ``fallback=True``, cannot start. ``num_workers`` only changes how envs
are sliced, which keeps group handling identical to the parallel backends.

``step_timeout`` holds in every thread. Driven from the main thread, an env past its budget
gets an exception raised inside its own code by a timer signal (`turnpool.worker.deadline`),
which also cuts blocking calls such as ``time.sleep``. A pool *started* with a deadline where
no signal can reach the env (another thread) never gets this backend: the one choice at start
(`turnpool.backends.choice`) gives its slices to threads instead. One case is left to this
backend: a pool started on the main thread and then driven from another one (a
`turnpool.pool.slots.SlotEngine` starts its pool in the caller and drives it from its own
thread). At the first request with a deadline off the main thread, the hosts, envs as they
are, are handed to one thread each (`turnpool.backends.thread.ThreadBackend`, `threaded`):
the pool then waits for them within the deadline, and a thread stuck past it is abandoned and
its slice rebuilt (the pool restores the innocent envs by replay), so a blocking env never
freezes the pool. A hang inside C code that never
returns stays in the abandoned thread; an env that kills its process kills the caller (use a
process backend for such envs). Exceptions are isolated per env either way.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Sequence
from typing import Any, ClassVar

from turnpool.backends.base import Backend, raise_build_errors
from turnpool.backends.thread import ThreadBackend
from turnpool.worker.deadline import (
    TIMED_OUT,
    InProcessDeadline,
    StepInterrupted,
    signal_timer_free,
)
from turnpool.worker.host import EnvHost
from turnpool.worker.protocol import EnvBuild, Op, Reply, Request, failed_reply


class SequentialBackend(Backend):
    """Runs each request to completion inside ``send`` (or hands its hosts to threads, see
    the module docstring)."""

    name: ClassVar[str] = "sequential"

    def __init__(self, builds: Sequence[EnvBuild], num_workers: int | None = None, *,
                 mp_context: str | None = None, **options: Any) -> None:
        super().__init__(builds, num_workers, mp_context=mp_context, **options)
        self._deadline = InProcessDeadline()
        self._limits: dict[Op, float | None] = {}
        #: the hosts' threads once a request with a deadline came off the main thread
        self._threads: ThreadBackend | None = None
        self._hosts: list[EnvHost] = []
        self._replies: list[deque[Reply]] = [deque() for _ in self.slices]

    def start(self, timeout: float) -> None:
        self._limits = Op.limits(self.step_timeout, self.reset_timeout)
        self._hosts = [EnvHost(self.builds_of(k), self._deadline.mark)
                       for k in range(self.num_workers)]
        errors = {i: e for h in self._hosts for i, e in h.build_errors.items()}
        if errors:
            self.close()
        raise_build_errors(errors)

    @property
    def threaded(self) -> bool:
        """Whether the hosts were handed to threads (a deadline set off the main thread)."""
        return self._threads is not None

    def send(self, worker: int, request: Request) -> None:
        if self._threads is None:
            limit = self._limits[request[1]]
            if limit is None or signal_timer_free():
                self._run(worker, request, limit)
                return
            self._hand_to_threads()
        assert self._threads is not None
        self._threads.send(worker, request)

    def _run(self, worker: int, request: Request, limit: float | None) -> None:
        self._deadline.begin(limit)
        try:
            reply = self._hosts[worker].handle(request)
        except StepInterrupted:  # fired between two envs: the request as a whole timed out
            reply = failed_reply(request, TIMED_OUT, "timeout")
        finally:
            self._deadline.end()
        self._replies[worker].append(reply)

    def _hand_to_threads(self) -> None:
        threads = ThreadBackend(self.builds, self.num_workers)
        threads.slices = self.slices
        threads.start(0.0, hosts=self._hosts)
        self._threads = threads
        self._hosts = []

    def wait(self, workers: Collection[int], timeout: float | None) -> list[int]:
        ready = [w for w in workers if self._replies[w]]
        if ready or self._threads is None:
            return ready
        return self._threads.wait(workers, timeout)

    def recv(self, worker: int) -> Reply:
        if self._replies[worker]:
            return self._replies[worker].popleft()
        assert self._threads is not None
        return self._threads.recv(worker)

    def progress(self, worker: int) -> tuple[int, float] | None:
        return self._threads.progress(worker) if self._threads is not None else None

    def restart(self, worker: int) -> None:
        self._replies[worker].clear()
        if self._threads is not None:
            self._threads.restart(worker)
            return
        self._hosts[worker].close()
        self._hosts[worker] = EnvHost(self.builds_of(worker), self._deadline.mark)

    @property
    def abandoned(self) -> int:
        """Threads given up on while stuck in env code (threaded mode only)."""
        return self._threads.abandoned if self._threads is not None else 0

    def close(self) -> None:
        for host in self._hosts:
            host.close()
        self._hosts = []
        if self._threads is not None:
            self._threads.close()
