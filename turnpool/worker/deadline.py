"""Deadlines for envs that run in the caller's own process (sequential backend, threads).

A worker process that hangs can be killed; an env running in the caller cannot. Two tools
keep ``step_timeout`` there:

* on the main thread, `InProcessDeadline`: an interval timer (``SIGALRM``) whose handler
  raises `StepInterrupted` in the env's frame, which also cuts blocking calls that Python
  restarts after a signal (``time.sleep``, socket waits). A timer the program itself had set
  (a test runner's timeout, say) is kept: its handler is chained and it fires when it was due;
* in any other thread no signal can reach the env, so the env runs in a thread of its own
  that the pool waits for within the deadline and gives up on when it is stuck (the thread
  backend, and the sequential backend driven off the main thread); `raise_in_thread` then
  asks the interpreter to unwind the abandoned thread (``PyThreadState_SetAsyncExc``), which
  happens as soon as it runs Python code again.

Neither stops a hang inside C code that never returns to the interpreter (a C extension loop):
only a backend whose workers are processes (``process``, ``process_pool``, ``joblib``,
``ray``) can stop that, by killing the worker. `StepInterrupted` derives from
``BaseException`` so that an env's own ``except Exception`` cannot swallow it.

Usage by a backend on the main thread (`signal_timer_free`)::

    deadline = InProcessDeadline()
    host = EnvHost(builds, deadline.mark)   # the host marks each env as it starts
    deadline.begin(2.0)                     # each env of the request gets 2 s
    try:
        reply = host.handle(request)
    finally:
        deadline.end()
"""

from __future__ import annotations

import _signal
import ctypes
import signal
import threading
import time
from types import FrameType
from typing import Any

# `signal.signal` / `signal.getsignal` wrap these C functions to convert numbers to enums and
# back, which costs more than the call itself; every in-process pool call arms and disarms,
# so the deadline calls them directly (same arguments, handlers come back as plain ints).
_getsignal = _signal.getsignal
_set_handler = _signal.signal

#: ``info["error"]`` of an env interrupted past its deadline in the caller's process.
TIMED_OUT = "step timeout (interrupted in-process)"
#: A timer firing this early relative to the deadline re-arms instead of raising.
_SLACK_S = 1e-3


class StepInterrupted(BaseException):
    """Raised inside env code that ran past its deadline in the caller's process."""


def raise_in_thread(thread_id: int, exc_type: type[BaseException] = StepInterrupted) -> bool:
    """Ask the interpreter to raise ``exc_type`` in thread ``thread_id`` the next time it runs
    Python code; False if no such thread exists."""
    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                                      ctypes.py_object(exc_type))
    return int(done) == 1


def signal_timer_free() -> bool:
    """Can this thread use ``SIGALRM`` for deadlines (the main thread, on a platform with
    interval timers, with the signal's handler, if any, set from Python)?"""
    if threading.current_thread() is not threading.main_thread():
        return False
    if not hasattr(signal, "setitimer"):  # a platform capability (no interval timers on Windows)
        return False
    return _getsignal(signal.SIGALRM) is not None


class InProcessDeadline:
    """Per-env deadlines for the envs the main thread runs (see the module docstring).

    `begin` starts a request with a per-env budget (None: no deadline; the caller checks
    `signal_timer_free` first), `mark` is the host's progress callback (called with each env id
    before its work, ``-1`` when the request is done), `end` disarms.
    """

    def __init__(self) -> None:
        self.limit: float | None = None
        self.env = -1
        self.since = 0.0
        self.fired = 0  # how many envs were interrupted (diagnostics, tests)
        self._use_signal = False
        self._previous: Any = None
        self._their_due: float | None = None  # when the program's own timer is due
        self._their_interval = 0.0

    # ------------------------------------------------------------------ request bracket
    def begin(self, limit: float | None) -> None:
        self.env, self.since = -1, time.monotonic()
        if limit is None:
            self.limit = None
            return
        self.limit = float(limit)
        self._use_signal = True
        left, self._their_interval = signal.getitimer(signal.ITIMER_REAL)
        self._their_due = self.since + left if left > 0 else None
        self._previous = _set_handler(signal.SIGALRM, self._on_alarm)
        signal.setitimer(signal.ITIMER_REAL, min(self.limit, left or self.limit))

    def mark(self, env_id: int) -> None:
        self.env = env_id
        self.since = time.monotonic()

    def end(self) -> None:
        if self.limit is None:
            return
        if self._use_signal:
            signal.setitimer(signal.ITIMER_REAL, 0.0)
            self._use_signal = False
            self._give_back_timer()
        self.limit = None
        self.env = -1

    # ------------------------------------------------------------------ mechanisms
    def _overdue(self) -> float:
        """Seconds left for the running env (<= 0: overdue); inf when none is running."""
        limit = self.limit
        if limit is None or self.env < 0:
            return float("inf")
        return self.since + limit - time.monotonic()

    def _give_back_timer(self) -> None:
        """Restore the program's handler and its timer (due now at the latest)."""
        _set_handler(signal.SIGALRM, self._previous if self._previous is not None
                     else signal.SIG_DFL)
        if self._their_due is not None:
            left = max(1e-6, self._their_due - time.monotonic())
            signal.setitimer(signal.ITIMER_REAL, left, self._their_interval)
            self._their_due = None

    def _on_alarm(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self._their_due is not None and now >= self._their_due - _SLACK_S:
            # The program's own timer is due: hand the signal over (its handler runs next).
            self._use_signal = False
            self._give_back_timer()
            return
        left = self._overdue()
        overdue = left <= _SLACK_S
        if overdue:
            self.fired += 1
            self.env = -1
            left = float("inf")
        if self.limit is not None:  # re-armed for the envs after this one
            wait = left if left != float("inf") else self.limit
            if self._their_due is not None:
                wait = min(wait, self._their_due - now)
            signal.setitimer(signal.ITIMER_REAL, max(wait, 1e-6))
        if overdue:
            raise StepInterrupted(TIMED_OUT)


__all__ = ["TIMED_OUT", "InProcessDeadline", "StepInterrupted", "raise_in_thread",
           "signal_timer_free"]
