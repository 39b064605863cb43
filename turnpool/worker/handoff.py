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

Each step request is one `HandoffJob` (`turnpool.worker.handoff_job`) whose `JobState` is
the whole story of its answer: ``RUNNING`` (one runner, the common path) -> ``DONE`` with the
full reply, or ``RUNNING`` -> ``HANDED`` (a stall moved its owner) -> ``PARTIAL`` (the owner
sent the partial reply) -> ``DONE`` (every straggler answered, late or ``timeout``).
`HandoffJob.hand_to`, `HandoffJob.finish`, `HandoffJob.give_up` and `HandoffJob.abort` are the
only transitions; each returns what to send, and the server (runners, watchdog, sends) only
acts on that. They are unit-tested without threads or processes
(``tests/worker/test_handoff_job.py``).

`HandoffServer` is the one request loop of every worker process (`turnpool.worker.transport
.serve`); with ``handoff_after=None`` it has no watchdog, never hands off and answers a step
request in one go (`EnvHost.handle`), as it answers resets and restores. Only step
requests are handed off (a reset or restore that hangs is the pool's deadline's to end).
Sends are serialized with one lock, so replies never interleave on the wire; a job's
transition and the sends it asks for happen under that lock together, so a job's replies
leave in the order of its transitions (an `Op.LATE` never overtakes the `Op.PARTIAL` that
names its env, which the pool would drop as unexpected).
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
from turnpool.worker.errors import short_error
from turnpool.worker.handoff_job import NOTHING, Answer, HandoffJob, JobState
from turnpool.worker.host import EnvHost
from turnpool.worker.protocol import (
    OP_CLOSE,
    OP_STEP,
    OP_STEP1,
    failed_reply,
)
from turnpool.worker.results import error_step

log = logging.getLogger(__name__)

#: Seconds an env may run before its request's other envs are handed to another thread.
DEFAULT_HANDOFF_AFTER = 0.05
#: Threads given up past ``step_timeout`` and still stuck that a worker keeps; beyond this
#: it stops handing off, so the next stall gets the worker replaced (which frees them).
MAX_STUCK_THREADS = 64


class _Runner:
    """A thread that runs requests; ``env`` / ``since``: where it is (``-1`` between envs)."""

    __slots__ = ("thread_id", "env", "since", "job", "wake", "abandoned")

    def __init__(self) -> None:
        self.thread_id = 0
        self.env = -1
        self.since = 0.0
        self.job: HandoffJob | None = None
        self.wake = threading.Event()
        #: its env was given up (answered ``timeout`` by the watchdog)
        self.abandoned = False


class HandoffServer:
    """Serve one worker's requests so that a stuck env holds back only itself (with
    ``handoff_after=None``: one reader, no watchdog, no hand-off)."""

    def __init__(self, recv_bytes: Callable[[], bytes], send_bytes: Callable[[bytes], None],
                 host: EnvHost, handoff_after: float | None, step_timeout: float | None,
                 encode: Callable[[Any], bytes], loads: Callable[[bytes], Any],
                 progress: Callable[[int], None],
                 stamp: Callable[[int, float], None] | None = None) -> None:
        self._recv = recv_bytes
        self._send_raw = send_bytes
        self._host = host
        self._after = handoff_after
        self._timeout = step_timeout
        self._encode = encode
        self._loads = loads
        self._progress = progress
        #: ``progress`` given the time already read (one clock read per env, no Python frame)
        self._stamp = stamp
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._runners: list[_Runner] = []
        self._spares: list[_Runner] = []
        self._reader: _Runner | None = None
        self._first: _Runner | None = None  # the thread that called `run`
        self._closing = threading.Event()

    # ------------------------------------------------------------------ entry
    def run(self) -> None:
        """Serve until ``close`` or until the pool hangs up (on the calling thread, which
        becomes the first reader)."""
        me = self._new_runner()
        self._reader = self._first = me
        if self._after is not None:
            threading.Thread(target=self._watch, name="turnpool-handoff-watch",
                             daemon=True).start()
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

    def _send_answer(self, transition: Callable[[], Answer], end: bool = True) -> bool:
        """Make a job's transition (under the lock) and send what it says, holding the send
        lock from one to the other, so a job's replies go out in the order its transitions
        happened: a straggler's `Op.LATE` never overtakes the `Op.PARTIAL` reply naming it
        (the pool drops a late result it does not expect yet, and would wait for that env
        until its deadline). False if the pool hung up (``end``: the server ends then)."""
        with self._send_lock:
            with self._lock:
                answer = transition()
                if answer.answered:
                    self._progress(-1)
            try:
                for reply in answer.replies:
                    self._send_raw(self._encode(reply))
            except OSError:
                failed = True
            else:
                failed = False
        if failed and end:
            self._end()
        return not failed

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
        if self._reader is not me:
            self._park(me)
            return False
        if me.job is not None:  # handed a stalled request: finish it first
            self._drain(me, me.job)
            return False
        try:
            request = self._loads(self._recv())
        except (EOFError, OSError):
            self._end()
            return True
        op = request[1]
        if op is OP_CLOSE:
            self._end()
            return True
        if (op is OP_STEP1 or op is OP_STEP) and self._after is not None:
            self._drain(me, HandoffJob(request, me))
            return False
        reply = self._host.handle(request)  # not a step, or no hand-off: answered in one go
        try:
            self._send(reply)
        except OSError:
            self._end()
            return True
        return False

    def _drain(self, me: _Runner, job: HandoffJob) -> None:
        """Run the envs of ``job`` that are left to claim, then send what is due."""
        me.job = job
        try:
            self._host.run_turns(job.claim, job.op is OP_STEP1, job.results, job.failed,
                                 self._at(me))
        except Exception as exc:  # a host bug: report it rather than kill the worker
            log.exception("worker request %s failed", job.op)
            whole = failed_reply((job.seq, job.op, None), short_error(exc), "worker_lost")
            aborted: list[bool] = []

            def abort() -> Answer:  # nobody else holds it: fail it as a whole
                aborted.append(job.abort())
                return Answer([whole], True) if aborted[0] else NOTHING

            self._send_answer(abort)
            if aborted[0]:
                return  # else its envs end as stragglers, answered below
        finally:
            me.env = -1
            me.job = None
        self._send_answer(lambda: job.finish(me, self._since))

    def _at(self, me: _Runner) -> Callable[[int], None]:
        """What runs before each env of a step: the runner's and the worker's progress
        (called per env, so it reads the clock once and, given ``stamp``, calls no Python
        code of the progress record's)."""
        progress = self._progress
        stamp = self._stamp
        monotonic = time.monotonic
        if stamp is None:
            def at(env_id: int) -> None:
                me.since = monotonic()
                me.env = env_id
                if self._reader is me:
                    progress(env_id)
            return at

        def at_stamped(env_id: int) -> None:
            me.since = now = monotonic()
            me.env = env_id
            if self._reader is me:
                stamp(env_id, now)
        return at_stamped

    def _since(self) -> tuple[dict[int, float], float]:
        """When each runner inside an env entered it, and now (for a partial reply)."""
        return {r.env: r.since for r in self._runners if r.env >= 0}, time.monotonic()

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
        """The pool hung up or asked to close: close the envs; the thread that called `run`
        returns from it once it is parked. Only where that thread is a worker process's main
        thread and is still busy in an env (a hang handed off) does the reader end the process.
        A worker that is a thread of some other program (the pool's own process: joblib
        ``threading``, ``sequential_env_types``; a Ray actor) never does: its stuck thread is
        abandoned, as a thread backend abandons one."""
        self._closing.set()
        with self._lock:
            for r in list(self._spares):
                r.wake.set()
            first = self._first
            busy = first is not None and first not in self._spares and first is not self._reader
        self._host.close()
        if busy and threading.main_thread().ident == (first.thread_id if first else None):
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(0)

    # ------------------------------------------------------------------ watchdog
    def _watch(self) -> None:
        assert self._after is not None
        period = max(0.001, self._after / 2)
        while not self._closing.wait(period):
            try:
                self._check(self._after)
            except Exception:  # never let the watchdog die silently
                log.exception("hand-off watchdog")

    def _check(self, after: float) -> None:
        now = time.monotonic()
        reader = self._reader
        job = reader.job if reader is not None else None
        if (reader is not None and job is not None and reader.env >= 0
                and now - reader.since > after):
            self._hand_off(reader, job)
        if self._timeout is not None:
            for r in list(self._runners):
                if (r is not self._reader and r.env >= 0 and not r.abandoned
                        and now - r.since > self._timeout):
                    self._give_up(r)

    def _hand_off(self, stuck: _Runner, job: HandoffJob) -> None:
        with self._lock:
            if stuck.job is not job or self._reader is not stuck:
                return
            if sum(r.abandoned for r in self._runners) >= MAX_STUCK_THREADS:
                return  # the pool's deadline replaces this worker (and its stuck threads)
            helper = self._spares.pop() if self._spares else None
            fresh = helper is None
            if helper is None:
                helper = _Runner()
            if not job.hand_to(helper):
                if not fresh:
                    self._spares.append(helper)
                return
            if fresh:
                self._runners.append(helper)
            helper.job = job
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
        given: list[tuple[HandoffJob, int]] = []

        def transition() -> Answer:
            job, env_id = r.job, r.env
            if job is None or env_id < 0 or r.abandoned:
                return NOTHING
            news, reply = job.give_up(env_id, error_step(TIMED_OUT, failure="timeout"))
            if not news:
                return NOTHING
            r.abandoned = True
            self._host.abandon(env_id)
            given.append((job, env_id))
            return Answer([] if reply is None else [reply], False)

        self._send_answer(transition, end=False)  # the reader sees a hang-up itself
        if not given:
            return
        job, env_id = given[0]
        log.warning("env %d stuck past step_timeout (%g s): answered timeout, thread "
                    "abandoned", env_id, self._timeout)
        with self._lock:
            if r.env == env_id and r.job is job:  # still inside it: unwind it there
                raise_in_thread(r.thread_id)


__all__ = ["DEFAULT_HANDOFF_AFTER", "MAX_STUCK_THREADS", "Answer", "HandoffJob",
           "HandoffServer", "JobState"]
