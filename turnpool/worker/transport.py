"""Worker-side code shared by the backends whose workers are other processes.

The process, process_pool, joblib and Ray backends differ only in how a worker is created and
how bytes reach it; what a worker does once it holds its slice of envs is the same everywhere,
so it is written here once:

* `serve`: the one request -> reply loop (`turnpool.worker.handoff.HandoffServer`), given
  the functions that receive and send a worker's bytes (a pipe's, a socket's, a Ray actor's
  inbox and outbox);
* `encode`: a reply pickled once, in which results that cannot be pickled become per-env
  errors (the env is to blame, not the worker);
* `ProgressSlot` / `ProgressWriter`: a 16-byte shared record ``(env_id, since)`` the worker
  writes before each env, so the pool can enforce ``step_timeout`` per env and blame the right
  env when a worker dies or hangs;
* `watch_parent`: workers never outlive the pool's process; `CLOSE_GRACE_S`.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import logging
import mmap
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from turnpool.worker.errors import short_error
from turnpool.worker.handoff import HandoffServer
from turnpool.worker.host import EnvHost
from turnpool.worker.protocol import (
    REPLY_KIND,
    LateReply,
    PartialReply,
    Reply,
    ReplyKind,
    ResetReply,
    RestoreReply,
    StepReply,
)
from turnpool.worker.results import error_reset, error_step

log = logging.getLogger(__name__)

PROTOCOL = pickle.HIGHEST_PROTOCOL
#: How long ``close`` lets workers close their envs before stopping them.
CLOSE_GRACE_S = 2.0
_WATCHDOG_PERIOD_S = 0.25


# ====================================================================== serving
def serve(recv_bytes: Callable[[], bytes], send_bytes: Callable[[bytes], None],
          host: EnvHost, handoff_after: float | None = None,
          step_timeout: float | None = None) -> None:
    """Answer requests until ``close`` or until the pool hangs up; the envs are closed either
    way. `turnpool.worker.handoff.HandoffServer` is the one request loop of every worker
    process; with ``handoff_after`` a stalled env holds back only itself.

    In a worker process of its own (`watch_parent` ran), everything alive once the envs are
    built (modules, envs) is moved out of the collector's sight (`gc.freeze`): each step
    allocates hundreds of result tuples, and every collection they trigger would otherwise
    walk that whole heap again. Garbage made later is collected as usual; the pool's own
    process is never touched (a joblib ``threading`` worker serves there)."""
    if _WATCHING:
        gc.freeze()
    progress = host.progress
    stamp = progress.stamp if isinstance(progress, ProgressWriter) else None
    HandoffServer(recv_bytes, send_bytes, host, handoff_after or None, step_timeout, encode,
                  pickle.loads, progress, stamp).run()


def encode(reply: Reply) -> bytes:
    """The pickled reply; results that cannot be pickled become per-env errors (the env is to
    blame, not the worker), so a worker's transport always has something to carry."""
    try:
        return pickle.dumps(reply, PROTOCOL)
    except Exception as exc:
        return pickle.dumps(_picklable(reply, exc), PROTOCOL)


def _picklable(reply: Reply, exc: Exception) -> Reply:
    """Replace the results that cannot be pickled with per-env errors, as the reply's kind
    (`REPLY_KIND`) says its payload holds them; a kind with no per-env replacement fails the
    request as a whole."""
    seq, op, payload, failure, error = reply
    replace = _REPLACE.get(REPLY_KIND[op])
    if replace is None:
        return (seq, op, None, "unpicklable", "unpicklable reply: " + short_error(exc))
    return (seq, op, replace(payload), failure, error)


def _unpicklable_turn(reason: str) -> Any:
    return error_step(reason, failure="unpicklable")


def _turns(payload: StepReply) -> StepReply:
    results, failed = payload
    fixed, bad = _fix_items(results, _unpicklable_turn)
    return fixed, sorted(set(failed) | set(bad))


def _partial(payload: PartialReply) -> PartialReply:
    # the pool reads each result's own error: no failed list
    results, pending = payload
    return _fix_items(results, _unpicklable_turn)[0], pending


def _late(payload: LateReply) -> LateReply:
    fixed = _fix_items([r for _, r in payload], _unpicklable_turn)[0]
    return list(zip([i for i, _ in payload], fixed))


def _resets(payload: ResetReply) -> ResetReply:
    return _fix_items(payload, lambda r: error_reset(r, "unpicklable"))[0]


def _restored(payload: RestoreReply) -> RestoreReply:
    return _fix_items(payload, lambda r: r)[0]


#: reply kind -> how its unpicklable items are replaced (`ReplyKind.VALUES`: not per env)
_REPLACE: dict[ReplyKind, Callable[[Any], Any]] = {
    ReplyKind.TURNS: _turns,
    ReplyKind.PARTIAL: _partial,
    ReplyKind.LATE: _late,
    ReplyKind.RESETS: _resets,
    ReplyKind.RESTORED: _restored,
}


def _fix_items(items: list[Any], failed: Callable[[str], Any]) -> tuple[list[Any], list[int]]:
    """``items`` with each one that cannot be pickled replaced by ``failed(reason)``, and the
    indices replaced."""
    fixed: list[Any] = []
    bad: list[int] = []
    for k, item in enumerate(items):
        try:
            pickle.dumps(item, PROTOCOL)
            fixed.append(item)
        except Exception as item_exc:
            bad.append(k)
            fixed.append(failed("unpicklable result: " + short_error(item_exc)))
    return fixed, bad


# ====================================================================== progress
_SLOT = struct.Struct("<qd")  # env_id, time.monotonic() of its start


class ProgressSlot:
    """The caller's end of a worker's progress record ``(env_id, since)``.

    It is a small file in ``/dev/shm`` (or the temp dir) that the worker opens by path
    (`ProgressWriter`); the caller removes the name as soon as the worker has mapped it
    (`unlink`), so nothing stays behind even if the caller is killed later. A worker in the
    caller's own process (a thread) writes through `write`. ``ProgressSlot(file=False)``
    holds no file: an idle standby worker's, which gets its file with its slice, so a caller
    killed while its standby idles leaves nothing behind either.
    """

    def __init__(self, file: bool = True) -> None:
        self.path = ""
        self._map: mmap.mmap | None = None
        if not file:
            return
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, self.path = tempfile.mkstemp(prefix="turnpool-progress-", dir=folder)
        try:
            os.ftruncate(fd, _SLOT.size)
            self._map = mmap.mmap(fd, _SLOT.size)
        finally:
            os.close(fd)
        self.write(-1)

    def write(self, env_id: int) -> None:
        if self._map is not None:
            _SLOT.pack_into(self._map, 0, env_id, time.monotonic())

    def read(self) -> tuple[int, float] | None:
        if self._map is None:
            return None
        env_id, since = _SLOT.unpack_from(self._map, 0)
        return int(env_id), float(since)

    def unlink(self) -> None:
        if self.path:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    def close(self) -> None:
        self.unlink()
        if self._map is not None:
            self._map.close()
            self._map = None


class ProgressWriter:
    """The worker's end of a `ProgressSlot`; a no-op where the file is not visible (another
    host), because progress is a diagnosis aid, not a requirement."""

    def __init__(self, path: str | None) -> None:
        self._map: mmap.mmap | None = None
        #: ``stamp(env_id, since)``: the record written with a time the caller already read
        #: (C speed: the request loop calls it before every env, `HandoffServer`)
        self.stamp: Callable[[int, float], None] = _no_stamp
        if path:
            try:
                fd = os.open(path, os.O_RDWR)
            except OSError:
                return
            try:
                self._map = mmap.mmap(fd, _SLOT.size)
            finally:
                os.close(fd)
            self.stamp = functools.partial(_SLOT.pack_into, self._map, 0)

    def __call__(self, env_id: int) -> None:
        if self._map is not None:
            _SLOT.pack_into(self._map, 0, env_id, time.monotonic())


def _no_stamp(env_id: int, since: float) -> None:
    pass


# ====================================================================== parent death
_WATCHING = False


def watch_parent(owner_pid: int, die_with_parent: bool = False) -> None:
    """End this worker process soon after the process that owns the pool dies.

    With ``die_with_parent`` (the caller started us from its main thread) Linux's
    ``PR_SET_PDEATHSIG`` kills us with our parent; a watchdog thread also exits when we are
    re-parented or multiprocessing's parent sentinel closes (the only signal that works under
    forkserver). Does nothing in the owner itself (a joblib ``threading`` worker runs there).
    """
    global _WATCHING
    if _WATCHING or os.getpid() == owner_pid:
        return
    _WATCHING = True
    if die_with_parent:
        _die_with_parent()
    parent = os.getppid()
    try:
        os.kill(owner_pid, 0)
    except ProcessLookupError:
        os._exit(0)  # the pool died before we could watch it
    threading.Thread(target=_watch, args=(parent,), name="turnpool-parent-watch",
                     daemon=True).start()


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the thread that forked it exits."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 == PR_SET_PDEATHSIG
    except (OSError, AttributeError) as exc:
        log.debug("PR_SET_PDEATHSIG unavailable: %s", exc)


def _watch(parent: int) -> None:
    """Exit as soon as the pool's process is gone.

    Two signals, because neither covers every start method: re-parenting changes our ppid
    (spawn, fork), and multiprocessing's parent sentinel reaches EOF when the pool's process
    dies (the only one for forkserver, whose server outlives the pool while we run).
    """
    mp_parent = multiprocessing.parent_process()
    sentinel = mp_parent.sentinel if mp_parent is not None else None
    while os.getppid() == parent:
        if sentinel is None:
            time.sleep(_WATCHDOG_PERIOD_S)
        elif multiprocessing.connection.wait([sentinel], _WATCHDOG_PERIOD_S):
            break
    os._exit(0)


__all__ = ["CLOSE_GRACE_S", "PROTOCOL", "ProgressSlot", "ProgressWriter",
           "encode", "serve", "watch_parent"]
