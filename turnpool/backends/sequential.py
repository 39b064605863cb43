"""Sequential backend: every worker's `EnvHost` runs in the caller, one after the other.

The floor for microsecond envs (no hand-off at all) and the fallback when ``auto``'s choice, or
a backend started with ``fallback=True``, cannot start. ``num_workers`` only changes how envs
are sliced, which keeps group handling identical to the parallel backends.

``step_timeout`` holds in every thread. Driven from the main thread, an env past its budget
gets an exception raised inside its own code by a timer signal (`turnpool.worker.deadline`),
which also cuts blocking calls such as ``time.sleep``. A pool *started* with a deadline where
no signal can reach the env (another thread) never gets this backend: the one choice at start
(`turnpool.backends.choice`) gives its slices to the thread backend instead. A pool started
on the main thread may still be driven from another one (a `turnpool.pool.slots.SlotEngine`
starts its pool in the caller and drives it from its own thread); each request is placed by
one rule: in the caller when no deadline applies or the timer signal can keep it, else on
its worker's *lane*, a thread that runs that worker's requests on the same
host, envs as they are (`threaded` tells whether any lane ran). The pool waits for a lane
within the deadline; a lane stuck past it is abandoned (`abandoned` counts them; it is
unwound by `turnpool.worker.deadline.raise_in_thread` once it runs Python code again) and the
worker gets a freshly built host (the pool restores the innocent envs by replay), so a
blocking env never freezes the pool. A hang inside C code that never returns stays in the
abandoned thread; an env that kills its process kills the caller (use a process backend for
such envs). Exceptions are isolated per env either way.
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
from turnpool.worker.deadline import (
    TIMED_OUT,
    InProcessDeadline,
    StepInterrupted,
    raise_in_thread,
    signal_timer_free,
)
from turnpool.worker.errors import short_error
from turnpool.worker.host import EnvHost
from turnpool.worker.protocol import Op, Reply, Request, failed_reply
from turnpool.worker.transport import CLOSE_GRACE_S, ProgressSlot

log = logging.getLogger(__name__)

_DEAD = object()  # a reply slot meaning "the lane died"


class _Lane:
    """A thread that runs one worker's requests on that worker's host, for callers that cannot
    keep their deadline; its replies go to `SequentialBackend._post`."""

    def __init__(self, backend: SequentialBackend, worker: int) -> None:
        self.backend = backend
        self.worker = worker
        self.inbox: queue.SimpleQueue[tuple[EnvHost, Request] | None] = queue.SimpleQueue()
        self.progress = ProgressSlot()
        self.progress.unlink()  # written and read in this process only
        #: given up while stuck: the host it is in is its own to close when it returns
        self.abandoned = False
        self.thread = threading.Thread(target=self._loop, name=f"turnpool-lane-{worker}",
                                       daemon=True)
        self.thread.start()

    def run(self, host: EnvHost, request: Request) -> None:
        host.progress = self.progress.write
        self.inbox.put((host, request))

    def _loop(self) -> None:
        host: EnvHost | None = None
        try:
            while (item := self.inbox.get()) is not None:
                host, request = item
                try:
                    reply: Any = host.handle(request)
                except StepInterrupted:  # given up; whatever it answers is ignored
                    break
                except BaseException as exc:  # SystemExit from env code: the worker is gone
                    log.warning("env lane %d stopped: %s", self.worker, short_error(exc))
                    self.backend._post(self, _DEAD)
                    self.abandoned = True  # its host goes with it
                    break
                if self.abandoned:
                    break
                self.backend._post(self, reply)
        except StepInterrupted:  # interrupted after it had come back by itself
            pass
        finally:
            if self.abandoned and host is not None:
                host.close()

    def abandon(self, stuck: bool) -> None:
        """Give the lane up: it exits once free and closes the host it ran; a ``stuck`` one is
        unwound as soon as it runs Python code again."""
        self.abandoned = True
        self.inbox.put(None)
        ident = self.thread.ident
        if stuck and ident is not None and self.thread.is_alive():
            raise_in_thread(ident)


class SequentialBackend(Backend):
    """Runs each request to completion inside ``send``, or on its worker's lane where the
    caller cannot keep its deadline (see the module docstring)."""

    name: ClassVar[str] = "sequential"

    def __init__(self, builds: Sequence[EnvBuild], num_workers: int | None = None, *,
                 mp_context: str | None = None, **options: Any) -> None:
        super().__init__(builds, num_workers, mp_context=mp_context, **options)
        self._deadline = InProcessDeadline()
        self._limits: dict[Op, float | None] = {}
        self._hosts: list[EnvHost] = []
        self._replies: list[deque[Any]] = [deque() for _ in self.slices]
        self._cond = threading.Condition()
        #: per worker, its lane once a request had to leave the caller
        self._lanes: list[_Lane | None] = [None] * self.num_workers
        #: workers whose request is on their lane now
        self._on_lane: set[int] = set()
        #: lanes given up on while stuck in env code (they exit if the code ever returns)
        self.abandoned = 0

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
        """Whether a request ever ran on a lane (a deadline off the main thread)."""
        return any(lane is not None for lane in self._lanes) or self.abandoned > 0

    def send(self, worker: int, request: Request) -> None:
        limit = self._limits[request[1]]
        if limit is None or signal_timer_free():  # the caller can keep the deadline
            self._run(worker, request, limit)
            return
        lane = self._lanes[worker]
        if lane is None:
            lane = self._lanes[worker] = _Lane(self, worker)
        with self._cond:
            self._on_lane.add(worker)
        lane.run(self._hosts[worker], request)

    def _run(self, worker: int, request: Request, limit: float | None) -> None:
        host = self._hosts[worker]
        host.progress = self._deadline.mark
        self._deadline.begin(limit)
        try:
            reply = host.handle(request)
        except StepInterrupted:  # fired between two envs: the request as a whole timed out
            reply = failed_reply(request, TIMED_OUT, "timeout")
        finally:
            self._deadline.end()
        self._replies[worker].append(reply)

    def _post(self, lane: _Lane, reply: Any) -> None:
        with self._cond:
            if self._lanes[lane.worker] is lane:
                self._on_lane.discard(lane.worker)
                self._replies[lane.worker].append(reply)
                self._cond.notify_all()

    def wait(self, workers: Collection[int], timeout: float | None) -> list[int]:
        replies = self._replies
        ready = [w for w in workers if replies[w]]
        if ready or not self._on_lane:  # what ran in the caller is all there is
            return ready or [w for w in workers if replies[w]]
        with self._cond:
            if any(w in self._on_lane for w in workers):
                self._cond.wait_for(lambda: any(replies[w] for w in workers), timeout)
            return [w for w in workers if replies[w]]

    def recv(self, worker: int) -> Reply:
        reply = self._replies[worker].popleft()
        if reply is _DEAD:
            raise WorkerLost("worker lane died")
        result: Reply = reply
        return result

    def progress(self, worker: int) -> tuple[int, float] | None:
        lane = self._lanes[worker]
        return lane.progress.read() if lane is not None and worker in self._on_lane else None

    def restart(self, worker: int) -> None:
        with self._cond:
            lane = self._lanes[worker]
            self._lanes[worker] = None
            stuck = worker in self._on_lane
            self._on_lane.discard(worker)
            self._replies[worker].clear()
        if lane is None:
            self._hosts[worker].close()
        else:  # the lane closes the host it ran (a stuck one, if it ever returns)
            lane.abandon(stuck)
            self.abandoned += stuck
        self._hosts[worker] = EnvHost(self.builds_of(worker), self._deadline.mark)

    def close(self) -> None:
        with self._cond:
            lanes, self._lanes = self._lanes, [None] * self.num_workers
            busy = set(self._on_lane)
        for k, lane in enumerate(lanes):
            if lane is not None:
                lane.abandoned = k in busy  # a busy lane closes the host it is in itself
                lane.inbox.put(None)
        deadline = time.monotonic() + CLOSE_GRACE_S
        for k, lane in enumerate(lanes):
            if lane is not None and lane.abandoned:
                lane.thread.join(max(0.0, deadline - time.monotonic()))
                if lane.thread.is_alive():  # stuck in env code: a daemon thread
                    log.warning("env lane %d is stuck and was abandoned", k)
        for k, host in enumerate(self._hosts):
            lane = lanes[k]
            if lane is None or not lane.abandoned:
                host.close()
        self._hosts = []
