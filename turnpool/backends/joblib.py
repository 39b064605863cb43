"""joblib backend: each turnpool worker is one joblib task that lives as long as the pool and
dials back (`turnpool.backends.dialback`), so no ``Parallel`` call, envs shipped or result
polling happens per step. ``joblib_backend``: ``"loky"`` (default), ``"multiprocessing"`` or
``"threading"``; ``n_jobs=-1`` means one worker per core (joblib's rule); ``mp_context`` is
ignored. All slices start in one ``Parallel`` call, a restarted slice in a new one-task call,
each call in a daemon thread; a stuck task is interrupted by a signal, not killed.

Faults: loky terminates *all* its workers when one dies, so every slice reports lost and the
pool rebuilds the innocent envs by reset + replay; ``multiprocessing`` never returns from a
call whose worker died (the call is stopped at close, which returns once that call has
terminated and joined its processes); a hung ``threading`` worker is abandoned. loky's
executor is process-wide and resized only when idle, so two joblib/loky pools alive at once
need the same ``num_workers``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from turnpool.backends.dialback import FINISHED, INTERRUPT, DialBackBackend, dial_and_serve
from turnpool.backends.remote import Stream
from turnpool.worker.build import EnvBuild
from turnpool.worker.errors import short_error
from turnpool.worker.transport import CLOSE_GRACE_S, ProgressSlot

log = logging.getLogger(__name__)

JOBLIB_BACKENDS = ("loky", "multiprocessing", "threading")
_INTERRUPT_GRACE_S = 1.0
_BROKEN_EXECUTOR_WAIT_S = 15.0
#: bound on a stopped process-flavour call's return (it terminates and joins its pool)
_TERMINATE_WAIT_S = 10.0


def resolve_n_jobs(n_jobs: int, num_envs: int) -> int:
    """joblib's ``n_jobs`` rule (``-1`` all cores, ``-2`` all but one...), at most ``num_envs``."""
    if n_jobs == 0:
        raise ValueError("n_jobs == 0 has no meaning")
    if n_jobs < 0:
        import joblib

        n_jobs = max(1, joblib.cpu_count() + 1 + n_jobs)
    return max(1, min(n_jobs, num_envs))


class _Launch:
    """One ``Parallel`` call running a few long-lived slice tasks in a daemon thread."""

    def __init__(self, flavour: str, n_jobs: int, tasks: list[Any], epoch: int = 0) -> None:
        self.flavour = flavour
        self.epoch = epoch  # which loky executor generation it runs on
        self.parallel: Any = None
        #: one of its tasks was lost (multiprocessing) or abandoned (threading): the call
        #: never returns by itself
        self.stuck = False
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
        """Wait for the call to return; stop it if a lost task would keep it waiting. A
        process flavour's call returns only after its pool's processes are terminated and
        joined, so it is given time for that even when it is stopped: a call still running
        when close returns leaves its processes behind."""
        if not self.stuck:
            self.thread.join(timeout)
        if self.thread.is_alive() and self.parallel is not None:
            # joblib has no public way to end a call whose worker vanished (multiprocessing)
            # or whose thread is stuck in env code (threading); its retrieval loop exits when
            # this flag is set and then terminates its own pool.
            self.parallel._aborting = True
            if self.flavour != "threading":  # bounded; it returns once its pool is joined
                self.thread.join(_TERMINATE_WAIT_S)
            elif not self.stuck:  # (a thread stuck in env code never ends: joblib's pool
                self.thread.join(timeout)  # would join it)
        if self.thread.is_alive():
            log.warning("a joblib call did not stop; its daemon thread is left behind")


@dataclass(eq=False, kw_only=True)
class _Task(Stream):
    """A joblib task serving one slice over one socket (``conn`` = ``out``), and the
    ``Parallel`` call that runs it."""

    launch: _Launch

    def join(self, timeout: float) -> None:
        if not self.launch.stuck:  # else `_Launch.stop` ends the call
            self.launch.thread.join(timeout)


class JoblibBackend(DialBackBackend[_Task]):
    """Slices served by long-lived joblib tasks; ``n_jobs`` is used when ``num_workers`` is
    None (see the module docstring)."""

    name: ClassVar[str] = "joblib"
    extra: ClassVar[str] = "joblib"
    #: a restart may land on a loky executor that is still dying: it is tried twice
    restart_attempts: ClassVar[int] = 2

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
        self._launches: list[_Launch] = []
        self._epoch = 0  # loky: the executor generation
        self.flavour = joblib_backend

    def _launch(self, slot: int | None) -> _Task:
        assert slot is not None  # no standby: joblib decides where its tasks run
        return self._launch_all([slot])[0]

    def _launch_all(self, slots: list[int]) -> list[_Task]:
        """One ``Parallel`` call for all of ``slots`` (at start: every slice)."""
        from joblib import delayed

        progress = [ProgressSlot() for _ in slots]
        tasks = [delayed(dial_and_serve)(*self._task(self._init(k, p)))
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
        self._launches.append(launch)
        return [_Task(progress=p, launch=launch) for p in progress]

    def _running(self, worker: _Task) -> bool:
        return worker.launch.thread.is_alive()

    def _stop(self, worker: _Task) -> None:
        """Stop a lost or stuck worker: interrupt its task (a thread can only be abandoned)."""
        worker.close_pipes()  # a thread worker that ever returns sees EOF and exits
        killed = not worker.lost and self._interrupt(worker)
        if not self._closed and (worker.pid == self._owner_pid or (
                (worker.lost or killed) and self.flavour == "multiprocessing")):
            worker.launch.stuck = True  # replaced: its call waits for it forever
        worker.progress.close()
        if worker.lost and self.flavour == "loky" and not self._closed:
            self._await_broken_executor(worker.launch.epoch)
        worker.lost = True

    def _shutdown(self, workers: list[_Task]) -> None:
        super()._shutdown(workers)
        for launch in self._launches:
            launch.stop(CLOSE_GRACE_S)
        self._launches.clear()
        if self.flavour == "loky":
            _shutdown_loky(CLOSE_GRACE_S)

    def _interrupt(self, w: _Task) -> bool:
        """End a task still in env code: interrupt it, and kill its process only if it does
        not return (stuck in C); a thread worker can only be abandoned. True if killed."""
        mark = w.progress.read()
        if w.pid <= 0 or w.pid == self._owner_pid or mark is None or mark[0] == FINISHED:
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(w.pid, INTERRUPT)
        deadline = time.monotonic() + _INTERRUPT_GRACE_S
        while time.monotonic() < deadline:
            mark = w.progress.read()
            if mark is None or mark[0] == FINISHED:
                return False
            time.sleep(0.005)  # bounded, only while a stuck worker is being replaced
        log.warning("joblib worker pid %d ignored the interrupt; killing it", w.pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(w.pid, signal.SIGKILL)
        return True

    def _death(self, worker: int | None, w: _Task) -> str:
        return f"joblib worker {worker} ({self.flavour}) died"

    def _await_broken_executor(self, epoch: int) -> None:
        """A loky worker died, so loky terminates its whole executor (every slice on it is
        lost too). Each call that ran on it aborts and then terminates whatever executor is
        current, so the first restart after a break waits for those calls to end; slices that
        died with the same executor then launch at once on the new one."""
        if epoch != self._epoch:
            return  # died with an executor that is already replaced
        ending = [launch for launch in self._launches
                  if launch.epoch == self._epoch and launch.thread.is_alive()]
        deadline = time.monotonic() + _BROKEN_EXECUTOR_WAIT_S
        for launch in ending:
            launch.thread.join(max(0.0, deadline - time.monotonic()))
        self._epoch += 1


def _shutdown_loky(timeout: float) -> None:
    """Stop loky's process-wide executor (its idle workers would wait minutes for a next call
    and none may outlive the pool; killing them would break the executor under the next
    call). joblib exposes no handle to it, hence loky's module global."""
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


__all__ = ["JOBLIB_BACKENDS", "JoblibBackend", "resolve_n_jobs"]
