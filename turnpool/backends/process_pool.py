"""process_pool backend: one single-process ``ProcessPoolExecutor`` per worker, running one
task that lives as long as the pool and dials back (`turnpool.backends.dialback`), since a
shared task pool cannot route a task to the process that holds env *i*. The executor-style
knobs: ``max_workers`` (default ``min(8, cpu_count)``, never more than envs) when
``num_workers`` is not given; ``sequential_env_types`` (registered names or entry points):
those envs stay in the caller, in one more worker that is a thread of the caller's process.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import multiprocessing
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from turnpool.backends.dialback import DialBackBackend, dial_and_serve
from turnpool.backends.remote import Hello, Stream
from turnpool.envs.registry import registered
from turnpool.worker.build import EnvBuild, split_evenly
from turnpool.worker.transport import ProgressSlot


def default_max_workers(num_envs: int) -> int:
    """The executor-style default: ``min(8, os.cpu_count())`` workers, and no more than envs."""
    return max(1, min(8, os.cpu_count() or 1, num_envs))


def env_type_matches(build: EnvBuild, names: Iterable[str]) -> bool:
    """Does ``build`` belong to one of ``names`` (registered names or entry points)?"""
    specs = registered()
    for name in names:
        spec = specs.get(name)
        if build.entry_point == name or (spec is not None and spec.entry_point ==
                                         build.entry_point):
            return True
    return False


@dataclass(eq=False, kw_only=True)
class _Executor(Stream):
    """A one-process executor (``runner``) and its long task's future (``task``), or the
    caller's thread serving ``sequential_env_types`` (``runner``, no task)."""

    runner: Any
    task: Any = None

    def join(self, timeout: float) -> None:
        if self.task is not None:
            cf.wait([self.task], timeout=timeout)
        else:
            self.runner.join(timeout)


class ProcessPoolBackend(DialBackBackend[_Executor]):
    """One ``ProcessPoolExecutor(max_workers=1)`` per worker (see the module docstring)."""

    name: ClassVar[str] = "process_pool"
    start_methods: ClassVar[tuple[str, ...]] = ("spawn", "forkserver", "fork")
    start_errors = (*DialBackBackend.start_errors, RuntimeError)  # BrokenProcessPool is one

    @staticmethod
    def default_num_workers(num_envs: int) -> int:
        return default_max_workers(num_envs)

    def __init__(self, builds: Sequence[EnvBuild], num_workers: int | None = None, *,
                 mp_context: str | None = None, max_workers: int | None = None,
                 sequential_env_types: Sequence[str] | None = None, **options: Any) -> None:
        super().__init__(builds, num_workers or max_workers, mp_context=mp_context, **options)
        local_types = list(sequential_env_types or [])
        local_ids = [b.env_id for b in self.builds if env_type_matches(b, local_types)]
        #: the slot served in the caller (sequential_env_types), if any
        self._local_slot: int | None = None
        if local_ids:
            remote_ids = [b.env_id for b in self.builds if b.env_id not in set(local_ids)]
            workers = num_workers or max_workers or self.default_num_workers(len(remote_ids))
            self.slices = [s for s in split_evenly(remote_ids, workers) if s] + [local_ids]
            self._local_slot = len(self.slices) - 1
            self._workers = [None] * self.num_workers
        self._ctx: Any = None

    def _prepare(self) -> None:
        self._ctx = multiprocessing.get_context(self.mp_context)  # names a bad one itself
        super()._prepare()

    def _launch(self, slot: int | None) -> _Executor:
        assert slot is not None  # no standby: an idle executor would be a process too
        progress = ProgressSlot()
        init = self._init(slot, progress)
        if slot == self._local_slot:
            thread = threading.Thread(target=dial_and_serve, args=self._task(init), daemon=True,
                                      name="turnpool-sequential-worker")
            thread.start()
            return _Executor(runner=thread, progress=progress)
        executor = cf.ProcessPoolExecutor(max_workers=1, mp_context=self._ctx)
        main = threading.current_thread() is threading.main_thread()
        return _Executor(runner=executor, progress=progress,
                         task=executor.submit(dial_and_serve, *self._task(init, main)))

    def _running(self, worker: _Executor) -> bool:
        return worker.runner.is_alive() if worker.task is None else not worker.task.done()

    def _await_hello(self, worker: _Executor, slot: int | None, deadline: float) -> Hello:
        try:
            return super()._await_hello(worker, slot, deadline)
        except TimeoutError:
            if worker.task is not None and worker.task.done():
                worker.task.result(timeout=0)  # raises why it ended (a broken executor...)
            raise

    def _stop(self, worker: _Executor) -> None:
        worker.lost = True
        if worker.task is not None and not worker.task.done():  # dead, or stuck in env code
            _kill_executor(worker.runner)
        worker.close_pipes()  # the caller's thread sees the end and closes its envs
        if worker.task is not None:
            worker.runner.shutdown(wait=True, cancel_futures=True)
        worker.progress.close()


def _kill_executor(executor: cf.ProcessPoolExecutor) -> None:
    # The executor cannot stop a process stuck in a task; its process table is the only handle
    # that cannot outlive the process (a bare pid could be reused).
    for proc in list((executor._processes or {}).values()):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            proc.kill()


__all__ = ["ProcessPoolBackend", "default_max_workers", "env_type_matches"]
