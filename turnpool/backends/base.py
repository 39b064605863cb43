"""The Backend protocol: what a backend must do so that `EnvPool` can run envs on it.

A backend decides *where* envs run; the pool decides *what* runs (see ``turnpool/pool/``).
Worker ``k`` owns ``slices[k]`` for its whole life and serves it with one
`turnpool.worker.host.EnvHost`; the backend moves opaque requests to a worker and replies back
(formats in `turnpool.worker.protocol`). Adding a backend is one file with one `Backend`
subclass plus one line in `turnpool.backends.BACKENDS`.

The pool sends a worker its next request only after the reply to the last one (a partial
reply counts), so a backend never orders requests. A reply may come in parts: a process
worker that hands off a stalled env (`turnpool.worker.handoff`) answers with an `Op.PARTIAL`
reply and sends that env's result later as an `Op.LATE` reply, possibly after its next
request was sent; a backend only carries replies in the order its worker sent them.
Ready-first operation
(``EnvPool.step_async`` / ``poll``) needs nothing more: `Backend.wait` reports whichever
workers have a reply ready.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from turnpool.backends.auto import EnvProfile
from turnpool.worker.build import EnvBuild, split_evenly
from turnpool.worker.defaults import DEFAULT_MP_CONTEXT
from turnpool.worker.errors import BackendUnavailable, EnvBuildError, WorkerLost
from turnpool.worker.protocol import Reply, Request
from turnpool.worker.transport import ProgressSlot


def usable_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def one_per_core(num_envs: int) -> int:
    """One worker per usable core, never more than envs (process-like backends' default)."""
    return max(1, min(num_envs, usable_cores()))


class Backend(ABC):
    """Where envs run. One instance serves one pool; worker ``k`` owns ``slices[k]`` for life.

    Lifecycle: ``__init__`` (cheap, no processes; every attribute exists from here) ->
    ``start`` (may raise `BackendUnavailable`; only ``auto`` or ``fallback=True`` then falls
    back to sequential, see `turnpool.backends.start_backend`) -> any number of
    ``send`` / ``wait`` / ``recv`` / ``restart`` -> ``close`` (idempotent, leaves nothing
    running).

    Subclasses set ``name``.
    """

    name: ClassVar[str] = "base"
    #: the ``mp_context`` values this backend honours (empty: it ignores ``mp_context``).
    start_methods: ClassVar[tuple[str, ...]] = ()
    #: the pool's deadlines, set before `start` (backends that run envs in the caller's
    #: process enforce them in-process, see `turnpool.worker.deadline`)
    step_timeout: float | None = None
    reset_timeout: float | None = None

    @staticmethod
    def default_num_workers(num_envs: int) -> int:
        """Worker count used when the caller passes ``num_workers=None``."""
        return 1

    def __init__(self, builds: Sequence[EnvBuild], num_workers: int | None = None, *,
                 mp_context: str | None = None, **options: Any) -> None:
        self.builds = list(builds)
        ids = [b.env_id for b in self.builds]
        workers = num_workers if num_workers else self.default_num_workers(len(ids))
        self.slices: list[list[int]] = split_evenly(ids, workers)
        self._by_id = {b.env_id: b for b in self.builds}
        #: the start method for process-based backends (None: `DEFAULT_MP_CONTEXT`)
        self.mp_context = mp_context or DEFAULT_MP_CONTEXT
        self.options = options
        #: what ``pool.backend_name`` reports (``"auto->thread"`` when auto chose it), and
        #: auto's measurement; both set once by `turnpool.backends.start_backend`
        self.label: str = self.name
        self.profile: EnvProfile | None = None

    @property
    def num_workers(self) -> int:
        return len(self.slices)

    def builds_of(self, worker: int) -> list[EnvBuild]:
        return [self._by_id[i] for i in self.slices[worker]]

    @abstractmethod
    def start(self, timeout: float) -> None:
        """Start every worker and build its envs, or raise `BackendUnavailable`."""

    @abstractmethod
    def send(self, worker: int, request: Request) -> None:
        """Queue ``request`` for ``worker``; must not block on env work."""

    @abstractmethod
    def wait(self, workers: Collection[int], timeout: float | None) -> list[int]:
        """Block up to ``timeout`` s until some of ``workers`` have a reply ready or are dead;
        return those (possibly none). Never spins."""

    def wait_fds(self, workers: Collection[int]) -> list[int] | None:
        """File descriptors that become readable when one of ``workers`` has a reply ready or
        dies, for a caller that waits on them with others of its own (then `wait` with
        timeout 0 says which); None when this backend has none, or one of ``workers`` is
        gone already (then `wait`)."""
        return None

    @abstractmethod
    def recv(self, worker: int) -> Reply:
        """The worker's next reply, after `wait` reported it; raise `WorkerLost` if it died."""

    def progress(self, worker: int) -> tuple[int, float] | None:
        """``(env_id, since)`` of the env the worker is running (``-1`` between envs; ``since``
        is ``time.monotonic()`` in any process on this host), or None if unknown."""
        return None

    @abstractmethod
    def restart(self, worker: int) -> None:
        """Stop the worker (kill it if it can be killed) and start a fresh one with freshly
        built envs; replies of the old one must never surface."""

    @abstractmethod
    def close(self) -> None:
        """Stop every worker; idempotent; no process, thread or segment may remain."""

    def worker_pids(self) -> list[int]:
        """OS process ids of the workers, where they are processes (tests and diagnostics)."""
        return []

    def worker_nodes(self) -> list[str | None]:
        """Per worker, the cluster node it runs on (None: not on a cluster, or none now)."""
        return [None] * self.num_workers

    def worker_dead(self, worker: int) -> bool:
        """Is the worker's process known to be gone (so a late reply is a death, not a
        hang)? False when unknown."""
        return False


@dataclass(eq=False, kw_only=True)
class WorkerHandle:
    """What a backend whose workers are other processes keeps of each one, whatever runs it:
    its progress slot, its OS pid (``-1`` unknown), whether it is known to be lost, and whether
    it runs on this host (``local``: its progress slot and pid are meaningful here). Each
    backend subclasses it with the fields of its own transport."""

    progress: ProgressSlot
    pid: int = -1
    lost: bool = False
    local: bool = True

    def read_progress(self) -> tuple[int, float] | None:
        return self.progress.read() if self.local else None

    def close_pipes(self) -> None:
        """Drop this process's ends of the worker's connections (a transport that has some)."""

    def join(self, timeout: float) -> None:
        """Wait (at most ``timeout``) for a worker told to close to end."""


def raise_build_errors(errors: dict[int, str]) -> None:
    """Raise `EnvBuildError` if a worker reported envs it could not build (every backend
    calls this from ``start`` with what its workers reported)."""
    if errors:
        raise EnvBuildError(errors)


__all__ = ["Backend", "BackendUnavailable", "EnvBuildError", "WorkerHandle", "WorkerLost",
           "one_per_core",
           "raise_build_errors", "usable_cores"]
