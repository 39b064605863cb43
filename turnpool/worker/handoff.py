"""Hand-off: a worker process keeps answering its other envs while one env is stuck.

A worker runs its envs one after another, so without this an env that blocks (a hang, a slow
web call) holds back every env after it in its worker: head-of-line blocking. `HandoffServer`
serves a worker's requests with *runner* threads instead of one loop:

* One runner, the *reader*, receives requests and answers them, as the plain loop does; the
  common path costs one lock per request and nothing per env.
* A watchdog thread looks at the reader every ``handoff_after / 2`` s. When the reader has
  been inside one env of a step request for more than ``handoff_after`` s, the watchdog makes
  another runner (a parked spare, or a new thread) the reader and hands it the request: it
  runs the request's remaining envs (the runners share the request's claim iterator, see
  `EnvHost.run_turns`), then answers with an `Op.PARTIAL` reply (every result but the stuck
  ones, which are named with the time they started) and goes on serving new requests.
* The stuck runner, when its env returns, sends that result as an `Op.LATE` reply and parks.
* With a ``step_timeout``, the watchdog answers a runner stuck past it itself: a `Op.LATE`
  reply failing the env with ``timeout``; the host forgets the env (`EnvHost.abandon`, rebuilt
  at its next reset) and `StepInterrupted` is raised in the stuck thread, which unwinds it as
  soon as it runs Python code again. The pool still kills the worker if even that does not
  come (a hang in C code that holds the GIL), as it does without hand-off.
* A worker keeps at most `MAX_STUCK_THREADS` given-up threads; past that it stops handing
  off, and the next stall gets it replaced as before.

Only step requests are handed off (a reset or restore that hangs is the pool's deadline's to
end). Sends are serialized with one lock, so replies never interleave on the wire.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from turnpool.worker.deadline import TIMED_OUT, StepInterrupted, raise_in_thread
from turnpool.worker.host import EnvHost
from turnpool.worker.protocol import Op, Request, error_step

log = logging.getLogger(__name__)

#: Seconds an env may run before its request's other envs are handed to another thread.
DEFAULT_HANDOFF_AFTER = 0.05
#: Threads given up past ``step_timeout`` and still stuck that a worker keeps; beyond this
#: it stops handing off, so the next stall gets the worker replaced (which frees them).
MAX_STUCK_THREADS = 64


class _Job:
    """One step request being answered, shareable between runners."""

    __slots__ = ("seq", "op", "env_ids", "claim", "results", "failed", "owner", "handed",
                 "closed", "partial_sent", "reported", "given_up")

    def __init__(self, request: Request, owner: _Runner) -> None:
        self.seq, self.op, (env_ids, actions) = request
        self.env_ids = env_ids
        self.claim = enumerate(zip(env_ids, actions))
        self.results: list[Any] = [None] * len(env_ids)
        self.failed: list[int] = []
        #: the runner that answers the request (the reader it was handed to)
        self.owner = owner
        self.handed = False
        #: answered in full (no hand-off can start any more)
        self.closed = False
        self.partial_sent = False
        #: indices whose result was sent
        self.reported: set[int] = set()
        #: index -> the ``timeout`` result of an env given up before the partial reply (it
        #: wins over whatever its stuck runner writes later)
        self.given_up: dict[int, Any] = {}


class _Runner:
    """A thread that runs requests; ``env`` / ``since``: where it is (``-1`` between envs)."""

    __slots__ = ("thread_id", "env", "since", "job", "wake", "abandoned")

    def __init__(self) -> None:
        self.thread_id = 0
        self.env = -1
        self.since = 0.0
        self.job: _Job | None = None
        self.wake = threading.Event()
        #: its env was given up (answered ``timeout`` by the watchdog)
        self.abandoned = False


class HandoffServer:
    """Serve one worker's requests so that a stuck env holds back only itself."""

    def __init__(self, recv_bytes: Callable[[], bytes], send_bytes: Callable[[bytes], None],
                 host: EnvHost, handoff_after: float, step_timeout: float | None,
                 encode: Callable[[Any], bytes], loads: Callable[[bytes], Any],
                 progress: Callable[[int], None]) -> None:
        self._recv = recv_bytes
        self._send_raw = send_bytes
        self._host = host
        self._after = handoff_after
        self._timeout = step_timeout
        self._encode = encode
        self._loads = loads
        self._progress = progress
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._runners: list[_Runner] = []
        self._spares: list[_Runner] = []
        self._reader: _Runner | None = None
        self._closing = threading.Event()

    # ------------------------------------------------------------------ entry
    def run(self) -> None:
        """Serve until ``close`` or until the pool hangs up (on the calling thread, which
        becomes the first reader)."""
        me = self._new_runner()
        self._reader = me
        watchdog = threading.Thread(target=self._watch, name="turnpool-handoff-watch",
                                    daemon=True)
        watchdog.start()
        try:
            self._serve(me)
        finally:
            self._closing.set()
            for r in list(self._spares):
                r.wake.set()

    def _new_runner(self) -> _Runner:
        r = _Runner()
        r.thread_id = threading.get_ident()
        with self._lock:
            self._runners.append(r)
        return r

    def _send(self, reply: Any) -> None:
        data = self._encode(reply)
        with self._send_lock:
            self._send_raw(data)

    # ------------------------------------------------------------------ runners
    def _serve(self, me: _Runner) -> None:
        """One runner's loop: read and answer while it is the reader, park otherwise."""
        while not self._closing.is_set():
            try:
                if self._step(me):
                    return
            except StepInterrupted:  # given up, and unwound after its env had returned
                me.env = -1
                me.job = None

    def _step(self, me: _Runner) -> bool:
        """One turn of a runner's loop; True when the server is done."""
        loads, host = self._loads, self._host
        if self._reader is not me:
            self._park(me)
            return False
        if me.job is not None:  # handed a stalled request: finish it first
            self._drain(me, me.job)
            return False
        try:
            request = loads(self._recv())
        except (EOFError, OSError):
            self._end()
            return True
        op = request[1]
        if op is Op.CLOSE:
            self._end()
            return True
        if op.is_turn:
            self._drain(me, _Job(request, me))
            return False
        reply = host.handle(request)
        try:
            self._send(reply)
        except OSError:
            self._end()
            return True
        return False

    def _drain(self, me: _Runner, job: _Job) -> None:
        me.job = job
        at = self._at(me)
        try:
            self._host.run_turns(job.claim, job.op is Op.STEP1, job.results, job.failed, at)
        finally:
            me.env = -1
            me.job = None
        try:
            self._finish(me, job)
        except OSError:
            self._end()

    def _at(self, me: _Runner) -> Callable[[int], None]:
        progress = self._progress
        monotonic = time.monotonic

        def at(env_id: int) -> None:
            me.since = monotonic()
            me.env = env_id
            if self._reader is me:
                progress(env_id)
        return at

    def _finish(self, me: _Runner, job: _Job) -> None:
        """``me`` has no more envs of ``job`` to claim: answer what is due."""
        with self._lock:
            if not job.handed:  # the common path: one runner did every env
                job.closed = True
                self._progress(-1)
            else:
                late = self._due(me, job)
        if not job.handed:
            self._send((job.seq, job.op, (job.results, job.failed), None, None))
            return
        for reply in late:
            self._send(reply)

    def _due(self, me: _Runner, job: _Job) -> list[Any]:
        """The replies ``job`` owes now (under the lock): the partial reply when its owner is
        done, late results after it."""
        results = job.results
        if job.given_up:
            results = [job.given_up.get(k, r) for k, r in enumerate(results)]
        if not job.partial_sent:
            if job.owner is not me:
                return []  # the owner will include what this runner finished
            job.partial_sent = True
            pending = [k for k, r in enumerate(results) if r is None]
            done = [k for k, r in enumerate(results) if r is not None]
            job.reported.update(done)
            failed = set(job.failed) | set(job.given_up)
            if not pending:
                job.closed = True
                self._progress(-1)
                return [(job.seq, job.op, (results, sorted(failed)), None, None)]
            started = self._started(job, pending)
            self._progress(-1)
            return [(job.seq, Op.PARTIAL, (results, started), None, None)]
        fresh = [k for k, r in enumerate(results) if r is not None and k not in job.reported]
        if not fresh:
            return []
        job.reported.update(fresh)
        return [(job.seq, Op.LATE, [(job.env_ids[k], results[k]) for k in fresh], None, None)]

    def _started(self, job: _Job, pending: list[int]) -> list[tuple[int, float]]:
        """``(index, since)`` of each pending env (``since`` from the runner inside it)."""
        since = {r.env: r.since for r in self._runners if r.env >= 0}
        now = time.monotonic()
        return [(k, since.get(job.env_ids[k], now)) for k in pending]

    def _park(self, me: _Runner) -> None:
        with self._lock:
            if self._reader is me or self._closing.is_set():
                return
            me.abandoned = False
            if me not in self._spares:
                self._spares.append(me)
        me.wake.wait()
        me.wake.clear()

    def _end(self) -> None:
        """The pool hung up or asked to close: close the envs; a reader that is not the main
        thread ends the process (the main thread may be stuck in an env)."""
        self._closing.set()
        for r in list(self._spares):
            r.wake.set()
        self._host.close()
        if threading.current_thread() is not threading.main_thread():
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(0)

    # ------------------------------------------------------------------ watchdog
    def _watch(self) -> None:
        period = max(0.001, self._after / 2)
        while not self._closing.wait(period):
            try:
                self._check()
            except Exception:  # never let the watchdog die silently
                log.exception("hand-off watchdog")

    def _check(self) -> None:
        now = time.monotonic()
        reader = self._reader
        job = reader.job if reader is not None else None
        if (reader is not None and job is not None and reader.env >= 0
                and now - reader.since > self._after):
            self._hand_off(reader, job)
        if self._timeout is not None:
            for r in list(self._runners):
                if (r is not self._reader and r.env >= 0 and not r.abandoned
                        and now - r.since > self._timeout):
                    self._give_up(r)

    def _hand_off(self, stuck: _Runner, job: _Job) -> None:
        with self._lock:
            if job.closed or stuck.job is not job or self._reader is not stuck:
                return
            if sum(r.abandoned for r in self._runners) >= MAX_STUCK_THREADS:
                return  # the pool's deadline replaces this worker (and its stuck threads)
            job.handed = True
            helper = self._spares.pop() if self._spares else None
            fresh = helper is None
            if helper is None:
                helper = _Runner()
                self._runners.append(helper)
            helper.job = job
            job.owner = helper
            self._reader = helper
        if fresh:
            threading.Thread(target=self._helper_main, args=(helper,),
                             name="turnpool-runner", daemon=True).start()
        else:
            helper.wake.set()

    def _helper_main(self, me: _Runner) -> None:
        me.thread_id = threading.get_ident()
        self._serve(me)

    def _give_up(self, r: _Runner) -> None:
        """Answer ``timeout`` for the env ``r`` is stuck in, forget it, unwind ``r``."""
        with self._lock:
            job = r.job
            env_id = r.env
            if job is None or env_id < 0 or r.abandoned:
                return
            k = next((k for k, i in enumerate(job.env_ids) if i == env_id), -1)
            if k < 0 or k in job.reported or k in job.given_up:
                return
            r.abandoned = True
            self._host.abandon(env_id)
            timed_out = error_step(TIMED_OUT, failure="timeout")
            reply = None
            if job.partial_sent:  # answer it now, on its own
                job.reported.add(k)
                reply = (job.seq, Op.LATE, [(env_id, timed_out)], None, None)
            else:  # the owner's partial reply will carry it
                job.given_up[k] = timed_out
        log.warning("env %d stuck past step_timeout (%g s): answered timeout, thread "
                    "abandoned", env_id, self._timeout)
        if reply is not None:
            with contextlib.suppress(OSError):
                self._send(reply)
        with self._lock:
            if r.env == env_id and r.job is job:  # still inside it: unwind it there
                raise_in_thread(r.thread_id)


__all__ = ["DEFAULT_HANDOFF_AFTER", "HandoffServer"]
