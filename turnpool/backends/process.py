"""Process backend: long-lived worker processes, each owning a slice of envs for its life.

Per step each worker gets one pickled request over its pipe and sends one pickled reply, so the
fixed cost is one wake-up round trip per worker, not per env, which is what makes it cheaper
than one-process-per-env or task-pool designs.

Waiting blocks in ``poll(2)`` on the pipes plus each process's sentinel, so a worker that dies
is noticed at once and nothing spins. A worker publishes which env it is running (and since
when) in its `turnpool.worker.transport.ProgressSlot`: the pool uses it to enforce
``step_timeout`` per env and to blame the right env when a worker dies or hangs. A hung worker
is killed with SIGKILL.

A worker whose env stalls for ``handoff_after`` s (default 0.05; None turns it off) hands the
rest of its request to another thread and answers it at once; the stalled env's result
follows on its own (`turnpool.worker.handoff`), so one stuck env never holds back the envs
that share its worker.

Workers never outlive the pool's process: they ask the kernel to kill them when their parent
dies (Linux ``PR_SET_PDEATHSIG``), and a watchdog thread exits when their parent pid changes or
multiprocessing's parent sentinel closes (the only signal that works under forkserver).

Start methods: ``spawn`` (default; safe when the caller has threads, e.g. CUDA or tokenizers),
``forkserver`` (env modules preloaded into the server) and ``fork`` (fastest start, unsafe with
threads). With spawn/forkserver a replacement worker costs an interpreter start, so one idle
standby process is kept ready by default (``standby=False`` turns that off). The standby
starts after the live workers are ready and at the lowest CPU priority (nice 19), so its
interpreter start never takes CPU from the first steps; it gets its priority back when it
replaces a worker (where the OS refuses that, a fresh worker is started instead).

Spawn and forkserver workers re-run the main script's top-level code. A pool created by
unguarded top-level code (no ``if __name__ == "__main__":``) would make every worker create
a pool in turn, so the backend refuses to start there (`unguarded_main_call`) with a
`BackendUnavailable` that says to add the guard (``fallback=True`` runs sequentially instead,
with one warning); ``auto`` never picks processes there.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import select
import signal
import sys
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any, ClassVar

import cloudpickle

from turnpool.backends.base import (
    Backend,
    BackendUnavailable,
    EnvBuildError,
    WorkerHandle,
    WorkerLost,
    one_per_core,
    raise_build_errors,
)
from turnpool.worker.build import EnvBuild
from turnpool.worker.handoff import DEFAULT_HANDOFF_AFTER
from turnpool.worker.host import EnvHost
from turnpool.worker.protocol import Op, Reply, Request
from turnpool.worker.transport import (
    CLOSE_GRACE_S,
    PROTOCOL,
    ProgressSlot,
    ProgressWriter,
    serve,
    watch_parent,
)

log = logging.getLogger(__name__)

_RESTART_TIMEOUT_S = 120.0
#: The standby's nice value while it waits (lowest priority: it must not slow live steps).
STANDBY_NICE = 19


# ====================================================================== unguarded __main__
def unguarded_main_call() -> bool:
    """Is this call made by top-level code of the ``__main__`` script that is not under
    ``if __name__ == "__main__":``? Spawn/forkserver children re-run exactly that code."""
    main = sys.modules.get("__main__")
    path = vars(main).get("__file__") if main is not None else None
    if main is None or not path:
        return False  # -c, an interactive session, a notebook: nothing is re-run
    spec = main.__spec__
    if spec is not None and (spec.name == "__main__" or spec.name.endswith(".__main__")):
        return False  # `python -m package`: multiprocessing does not re-run a package main
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is main.__dict__:
            return not _guarded_line(str(path), frame.f_lineno)
        frame = frame.f_back  # type: ignore[assignment]
    return False  # main's top level has finished (or is not on the stack)


@functools.lru_cache(maxsize=8)
def _guard_ranges(path: str) -> tuple[tuple[int, int], ...] | None:
    """Line ranges of the ``if __name__ == "__main__":`` blocks of a script (None: unreadable)."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    ranges = []
    for node in tree.body:
        if isinstance(node, ast.If) and _is_main_test(node.test):
            ranges.append((node.body[0].lineno, node.end_lineno or node.body[-1].lineno))
    return tuple(ranges)


def _is_main_test(test: ast.expr) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    consts = [s.value for s in sides if isinstance(s, ast.Constant)]
    return names == ["__name__"] and consts == ["__main__"]


def _guarded_line(path: str, line: int) -> bool:
    ranges = _guard_ranges(path)
    return ranges is not None and any(lo <= line <= hi for lo, hi in ranges)


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
    """Entry point of a worker process: handshake, then one request -> one reply, forever."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the pool's to handle
    watch_parent(pool_pid, die_with_parent)
    try:
        outbox.send_bytes(pickle.dumps(("hello", os.getpid()), PROTOCOL))
        message = pickle.loads(inbox.recv_bytes())
    except (EOFError, OSError):
        return
    if message[0] != "init":  # closed while on standby
        return
    _kind, slot, blob, progress_path, handoff_after, step_timeout = message
    builds: list[EnvBuild] = pickle.loads(blob)
    host = EnvHost(builds, ProgressWriter(progress_path))
    outbox.send_bytes(pickle.dumps(("ready", slot, host.build_errors), PROTOCOL))
    serve(inbox.recv_bytes, outbox.send_bytes, host, handoff_after, step_timeout)


# ====================================================================== parent side
@dataclass(eq=False, kw_only=True)
class _Proc(WorkerHandle):
    """A worker process and its two pipes (requests out, replies in)."""

    runner: BaseProcess
    conn: multiprocessing.connection.Connection | None
    out: multiprocessing.connection.Connection | None


class ProcessBackend(Backend):
    """``num_workers`` processes (default: one per usable core, at most one per env)."""

    name: ClassVar[str] = "process"
    start_methods: ClassVar[tuple[str, ...]] = ("spawn", "forkserver", "fork")

    @staticmethod
    def default_num_workers(num_envs: int) -> int:
        return one_per_core(num_envs)

    def __init__(self, builds: Sequence[EnvBuild], num_workers: int | None = None, *,
                 mp_context: str | None = None, standby: bool | None = None,
                 handoff_after: float | None = DEFAULT_HANDOFF_AFTER,
                 **options: Any) -> None:
        super().__init__(builds, num_workers, mp_context=mp_context, **options)
        if handoff_after is not None and not handoff_after > 0:
            raise ValueError(f"handoff_after must be > 0 seconds or None, got {handoff_after!r}")
        self.handoff_after = handoff_after
        method = self.mp_context
        if method not in multiprocessing.get_all_start_methods():
            raise ValueError(f"mp_context must be one of {multiprocessing.get_all_start_methods()}"
                             f", got {method!r}")
        self.method = method
        self._ctx = multiprocessing.get_context(method)
        self._use_standby = standby if standby is not None else method != "fork"
        self._workers: list[_Proc] = []
        self._standby: _Proc | None = None
        self._owner_pid = os.getpid()
        self._closed = False
        self._exited: set[int] = set()  # workers whose sentinel fired in the last wait

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        if self.method != "fork" and unguarded_main_call():
            raise BackendUnavailable(
                f"process workers ({self.method}) re-run the main script's top-level code; "
                "create the pool under `if __name__ == \"__main__\":`")
        try:
            if self.method == "forkserver":
                modules = {__name__} | {b.entry_point.partition(":")[0] for b in self.builds}
                self._ctx.set_forkserver_preload(sorted(modules))  # type: ignore[attr-defined]
            self._workers = [self._spawn() for _ in range(self.num_workers)]
            for k, worker in enumerate(self._workers):
                self._send_init(worker, k)
            for k, worker in enumerate(self._workers):
                self._await_ready(worker, k, deadline)
            if self._use_standby:
                self._standby = self._spawn_standby()
        except EnvBuildError:  # the envs are broken, not the backend
            self.close()
            raise
        except (OSError, WorkerLost, TimeoutError, pickle.PicklingError, ValueError,
                EOFError) as exc:
            self.close()
            raise BackendUnavailable(f"process backend ({self.method}) failed to start: "
                                     f"{exc}") from exc

    def _spawn(self) -> _Proc:
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
        # its progress file comes with its slice (`_send_init`): an idle standby holds none
        return _Proc(runner=proc, progress=ProgressSlot(file=False), conn=rep_r, out=req_w,
                     pid=proc.pid)

    def _spawn_standby(self) -> _Proc:
        """An idle worker at the lowest priority: its start-up only uses idle CPU."""
        worker = self._spawn()
        _set_nice(worker.pid, STANDBY_NICE)
        return worker

    def _promote_standby(self) -> _Proc | None:
        """The standby at the pool's own priority, or None (then it is discarded)."""
        standby, self._standby = self._standby, None
        if standby is None:
            return None
        if _set_nice(standby.pid, os.getpriority(os.PRIO_PROCESS, 0)):
            return standby
        log.info("cannot restore the standby worker's priority; starting a fresh worker")
        self._kill(standby)
        self._use_standby = False  # it could never be promoted here
        return None

    def _send_init(self, worker: _Proc, slot: int) -> None:
        blob = cloudpickle.dumps(self.builds_of(slot))
        assert worker.out is not None
        if not worker.progress.path:
            worker.progress = ProgressSlot()
        worker.out.send_bytes(pickle.dumps(("init", slot, blob, worker.progress.path,
                                            self.handoff_after, self.step_timeout), PROTOCOL))

    def _await_ready(self, worker: _Proc, slot: int, deadline: float) -> None:
        conn = worker.conn
        assert conn is not None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"worker {slot} did not start in time")
            ready = multiprocessing.connection.wait([conn, worker.runner.sentinel], left)
            if conn in ready:
                try:
                    message = pickle.loads(conn.recv_bytes())
                except (EOFError, OSError) as exc:
                    worker.runner.join(1.0)
                    raise WorkerLost(f"worker {slot} died while starting "
                                     f"(exit code {worker.runner.exitcode})") from exc
                if message[0] == "ready":
                    raise_build_errors(message[2])
                    worker.progress.unlink()  # mapped by the worker: the name can go
                    return
            elif ready:
                worker.runner.join(1.0)
                raise WorkerLost(f"worker {slot} died while starting "
                                 f"(exit code {worker.runner.exitcode})")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        workers = list(self._workers)
        standby = self._standby
        self._workers, self._standby = [], None
        if os.getpid() != self._owner_pid:  # a forked copy of the owner: not ours to stop
            for w in workers + ([standby] if standby else []):
                _close_pipes(w)
            return
        if standby is not None:  # holds no envs; may still be importing
            self._kill(standby)
        bye = pickle.dumps((0, Op.CLOSE, None), PROTOCOL)
        for w in workers:
            if not w.lost and w.out is not None:
                with contextlib.suppress(OSError):
                    w.out.send_bytes(bye)
        deadline = time.monotonic() + CLOSE_GRACE_S
        for w in workers:
            w.runner.join(max(0.0, deadline - time.monotonic()))
        for w in workers:
            self._kill(w)

    def _kill(self, worker: _Proc) -> None:
        if worker.runner.is_alive():
            worker.runner.kill()
        worker.runner.join(5.0)
        worker.lost = True
        _close_pipes(worker)
        worker.progress.close()
        with contextlib.suppress(ValueError):
            worker.runner.close()

    # ------------------------------------------------------------------ protocol
    def send(self, worker: int, request: Request) -> None:
        w = self._workers[worker]
        if w.lost or w.out is None:
            raise WorkerLost("worker is gone")
        w.out.send_bytes(pickle.dumps(request, PROTOCOL))

    def wait(self, workers: Collection[int], timeout: float | None) -> list[int]:
        poller = select.poll()
        fds: dict[int, int] = {}
        dead: list[int] = []
        for k in workers:
            w = self._workers[k]
            if w.lost or w.conn is None:
                dead.append(k)
                continue
            fd = w.conn.fileno()
            fds[fd] = k
            poller.register(fd, select.POLLIN)
            fds[w.runner.sentinel] = k
            poller.register(w.runner.sentinel, select.POLLIN)
        if dead:
            return dead
        ms = None if timeout is None else max(0.0, timeout) * 1000.0
        while True:
            try:
                events = poller.poll(ms)
                break
            except InterruptedError:  # pragma: no cover - PEP 475 retries for us
                continue
        ready: set[int] = set()
        for fd, _ in events:
            k = fds[fd]
            ready.add(k)
            if fd == self._workers[k].runner.sentinel:
                self._exited.add(k)
        return sorted(ready)

    def recv(self, worker: int) -> Reply:
        w = self._workers[worker]
        try:
            # A worker can reply and then die: read what it sent before declaring it lost.
            if w.conn is not None and not w.lost and (worker not in self._exited
                                                      or w.conn.poll(0)):
                reply: Reply = pickle.loads(w.conn.recv_bytes())
                return reply
        except (EOFError, OSError):
            pass
        self._exited.discard(worker)
        w.runner.join(1.0)
        code = w.runner.exitcode if not w.lost else None
        if code is not None and code < 0:
            raise WorkerLost(f"worker died (signal {-code})")
        raise WorkerLost(f"worker died (exit code {code})")

    def progress(self, worker: int) -> tuple[int, float] | None:
        if not self._workers:
            return None
        return self._workers[worker].read_progress()

    def restart(self, worker: int) -> None:
        old = self._workers[worker]
        self._kill(old)
        self._exited.discard(worker)
        fresh = self._promote_standby() or self._spawn()
        self._workers[worker] = fresh
        try:
            self._send_init(fresh, worker)
            self._await_ready(fresh, worker, time.monotonic() + _RESTART_TIMEOUT_S)
        except (OSError, TimeoutError, EOFError) as exc:
            self._kill(fresh)
            raise WorkerLost(f"replacement worker failed: {exc}") from exc
        except WorkerLost:
            self._kill(fresh)
            raise
        except EnvBuildError as exc:
            self._kill(fresh)
            raise WorkerLost(f"replacement worker could not build its envs: {exc}") from exc
        if self._use_standby:
            self._standby = self._spawn_standby()

    def worker_pids(self) -> list[int]:
        pids = [w.pid for w in self._workers]
        if self._standby is not None:
            pids.append(self._standby.pid)
        return pids


def _close_pipes(worker: _Proc) -> None:
    for conn in (worker.conn, worker.out):
        if conn is not None:
            conn.close()
