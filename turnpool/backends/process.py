"""Process backend: long-lived worker processes, each owning a slice of envs for its life.

A step is one pickled request and one pickled reply per worker, over two one-way pipes (a
round trip is cheaper than over one socketpair); a hung worker is killed with SIGKILL. Start
methods: ``spawn`` (default; safe when the caller has threads), ``forkserver`` (env modules
preloaded into the server) and ``fork`` (fastest start, unsafe with threads). With spawn and
forkserver a replacement costs an interpreter start, so one idle standby process is kept
(``standby=False``: none): it starts with the workers, waits at nice 19 and gets our
priority back when it takes over a slice (where the OS refuses that, a fresh worker starts).
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
from turnpool.backends.remote import Stream, StreamBackend, WorkerInit, serve_worker
from turnpool.worker.build import EnvBuild
from turnpool.worker.children import sigint_blocked
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


def _worker_main(inbox: multiprocessing.connection.Connection,
                 outbox: multiprocessing.connection.Connection, pool_pid: int,
                 die_with_parent: bool) -> None:
    """A worker process: say it is up (a standby's readiness), wait for its `WorkerInit`
    (a standby waits long), then serve."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the pool's to handle
    # started with SIGINT blocked (`_launch`): now that it is ignored, let it through
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    watch_parent(pool_pid, die_with_parent)
    try:
        outbox.send_bytes(pickle.dumps(None))
        init = pickle.loads(inbox.recv_bytes())
    except (EOFError, OSError):
        return  # closed while on standby
    if isinstance(init, WorkerInit):
        serve_worker(inbox.recv_bytes, outbox.send_bytes, init)


@dataclass(eq=False, kw_only=True)
class _Proc(Stream):
    """A worker process and its two pipes (requests out, replies in)."""

    runner: BaseProcess

    def join(self, timeout: float) -> None:
        self.runner.join(timeout)


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
        if self.mp_context not in multiprocessing.get_all_start_methods():
            raise ValueError(f"mp_context must be one of {multiprocessing.get_all_start_methods()}"
                             f", got {self.mp_context!r}")
        self.method = self.flavour = self.mp_context
        self._ctx = multiprocessing.get_context(self.method)
        self._use_standby = standby if standby is not None else self.method != "fork"

    def _prepare(self) -> None:
        if self.method == "forkserver":
            modules = {__name__} | {b.entry_point.partition(":")[0] for b in self.builds}
            self._ctx.set_forkserver_preload(sorted(modules))  # type: ignore[attr-defined]

    def _launch(self, slot: int | None) -> _Proc:
        req_r, req_w = self._ctx.Pipe(duplex=False)
        rep_r, rep_w = self._ctx.Pipe(duplex=False)
        die_with_parent = threading.current_thread() is threading.main_thread()
        proc = self._ctx.Process(  # type: ignore[attr-defined]
            target=_worker_main, name="turnpool-worker",
            args=(req_r, rep_w, os.getpid(), die_with_parent), daemon=False)
        with sigint_blocked(self.method):
            proc.start()
        req_r.close()
        rep_w.close()
        # its progress file comes with its slice (`_load`): an idle standby holds none
        worker = _Proc(runner=proc, progress=ProgressSlot(file=False), conn=rep_r, out=req_w,
                       pid=proc.pid, sentinel=proc.sentinel)
        if slot is not None:
            self._load(worker, slot)
        return worker

    def _park(self, standby: _Proc) -> None:
        _set_nice(standby.pid, STANDBY_NICE)

    def _promote(self, standby: _Proc) -> bool:
        return _set_nice(standby.pid, os.getpriority(os.PRIO_PROCESS, 0))

    def _load(self, worker: _Proc, slot: int) -> None:
        assert worker.out is not None
        worker.progress = ProgressSlot()
        # cloudpickle: env classes defined in a script or a test travel by value
        worker.out.send_bytes(cloudpickle.dumps(self._init(slot, worker.progress)))

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
