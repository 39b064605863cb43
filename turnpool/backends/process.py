"""Process backend: long-lived worker processes, each owning a slice of envs for its life.

Per step each worker gets one pickled request over its pipe and sends one pickled reply, so the
fixed cost is one wake-up round trip per worker, not per env. The lifecycle is
`turnpool.backends.remote.StreamBackend`'s; this file starts processes and their two pipes,
keeps the standby at nice 19 and kills a hung worker with SIGKILL. Hand-off is on, as on every
remote backend (``handoff_after=0.05`` s; None turns it off). Workers die with the pool's process
(`turnpool.worker.transport.watch_parent`).

Start methods: ``spawn`` (default; safe when the caller has threads, e.g. CUDA or tokenizers),
``forkserver`` (env modules preloaded into the server) and ``fork`` (fastest start, unsafe with
threads). With spawn/forkserver a replacement worker costs an interpreter start, so one idle
standby process is kept ready by default (``standby=False`` turns that off). The first one
starts with the workers and `start` returns once it is up, so no interpreter start competes
with the first steps; it then waits at nice 19 (a later one, after a restart, starts there)
and gets our priority back when it replaces a worker (where the OS refuses that, a fresh
worker is started instead). A pool created by
unguarded top-level code is refused where the backend is chosen
(`turnpool.backends.choice.unguarded_main_call`).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any, ClassVar

import cloudpickle

from turnpool.backends.base import one_per_core
from turnpool.backends.choice import unguarded_main_call
from turnpool.backends.remote import Hello, Stream, StreamBackend, WorkerInit, serve_worker
from turnpool.worker.build import EnvBuild
from turnpool.worker.transport import ProgressSlot, watch_parent

#: The standby's nice value while it waits (lowest priority: it must not slow live steps).
STANDBY_NICE = 19


def _set_nice(pid: int, nice: int) -> bool:
    """Set a process's nice value; False where the OS refuses (raising needs privileges)."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, nice)
    except (OSError, AttributeError):
        return False
    return True


# ====================================================================== worker side
def _worker_main(inbox: multiprocessing.connection.Connection,
                 outbox: multiprocessing.connection.Connection, pool_pid: int,
                 die_with_parent: bool) -> None:
    """Entry point of a worker process: say it is up (a standby's readiness), wait for its
    `WorkerInit` (a standby waits long), then serve."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the pool's to handle
    watch_parent(pool_pid, die_with_parent)
    try:
        outbox.send_bytes(pickle.dumps(None))
        init = pickle.loads(inbox.recv_bytes())
    except (EOFError, OSError):
        return  # closed while on standby
    if isinstance(init, WorkerInit):
        serve_worker(inbox.recv_bytes, outbox.send_bytes, init)


# ====================================================================== parent side
@dataclass(eq=False, kw_only=True)
class _Proc(Stream):
    """A worker process and its two pipes (requests out, replies in)."""

    runner: BaseProcess


class ProcessBackend(StreamBackend[_Proc]):
    """``num_workers`` processes (default: one per usable core, at most one per env)."""

    name: ClassVar[str] = "process"
    start_methods: ClassVar[tuple[str, ...]] = ("spawn", "forkserver", "fork")

    @staticmethod
    def default_num_workers(num_envs: int) -> int:
        return one_per_core(num_envs)

    def __init__(self, builds: Sequence[EnvBuild], num_workers: int | None = None, *,
                 mp_context: str | None = None, standby: bool | None = None,
                 **options: Any) -> None:
        super().__init__(builds, num_workers, mp_context=mp_context, **options)
        method = self.mp_context
        if method not in multiprocessing.get_all_start_methods():
            raise ValueError(f"mp_context must be one of {multiprocessing.get_all_start_methods()}"
                             f", got {method!r}")
        self.method = method
        self._ctx = multiprocessing.get_context(method)
        self._use_standby = standby if standby is not None else method != "fork"

    def _start_failed(self, exc: BaseException) -> str:
        return f"process backend ({self.method}) failed to start: {exc}"

    def _prepare(self) -> None:
        if self.method == "forkserver":
            modules = {__name__} | {b.entry_point.partition(":")[0] for b in self.builds}
            self._ctx.set_forkserver_preload(sorted(modules))  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ a worker's start
    def _launch(self, slot: int | None) -> _Proc:
        # Two one-way pipes: a round trip is cheaper than over one socketpair.
        req_r, req_w = self._ctx.Pipe(duplex=False)
        rep_r, rep_w = self._ctx.Pipe(duplex=False)
        die_with_parent = threading.current_thread() is threading.main_thread()
        proc = self._ctx.Process(  # type: ignore[attr-defined]
            target=_worker_main, name="turnpool-worker",
            args=(req_r, rep_w, os.getpid(), die_with_parent), daemon=False)
        proc.start()
        req_r.close()
        rep_w.close()
        # its progress file comes with its slice (`_load`): an idle standby holds none
        worker = _Proc(runner=proc, progress=ProgressSlot(file=False), conn=rep_r, out=req_w,
                       pid=proc.pid, sentinel=proc.sentinel)
        if slot is None and self._started:  # a replacement's standby: it only uses idle CPU
            _set_nice(worker.pid, STANDBY_NICE)
        elif slot is not None:
            self._load(worker, slot)
        return worker

    def _await_hello(self, worker: _Proc, slot: int | None, deadline: float) -> Hello | None:
        hello = super()._await_hello(worker, slot, deadline)
        if slot is None:  # the first standby, up: it waits at the lowest priority
            _set_nice(worker.pid, STANDBY_NICE)
        return hello

    def _promote(self, standby: _Proc) -> bool:
        return _set_nice(standby.pid, os.getpriority(os.PRIO_PROCESS, 0))

    def _load(self, worker: _Proc, slot: int) -> None:
        assert worker.out is not None
        worker.progress = ProgressSlot()
        # cloudpickle: env classes defined in a script or a test travel by value
        worker.out.send_bytes(cloudpickle.dumps(self._init(slot, worker.progress)))

    # ------------------------------------------------------------------ a worker's end
    def _join(self, worker: _Proc, timeout: float) -> None:
        worker.runner.join(timeout)

    def _stop(self, worker: _Proc) -> None:
        if worker.runner.is_alive():
            worker.runner.kill()
        worker.runner.join(5.0)
        worker.lost = True
        worker.close_pipes()
        worker.progress.close()
        try:
            worker.runner.close()
        except ValueError:
            pass

    def _death(self, worker: int | None, w: _Proc) -> str:
        if w.lost:
            return "worker died (exit code None)"
        w.runner.join(1.0)
        code = w.runner.exitcode
        if code is not None and code < 0:
            return f"worker died (signal {-code})"
        return f"worker died (exit code {code})"


__all__ = ["STANDBY_NICE", "ProcessBackend", "unguarded_main_call"]
