"""Sequential backend: every worker's `EnvHost` runs in the caller, one after the other.

The floor for microsecond envs (no hand-off at all) and the fallback when a parallel backend
cannot start. ``num_workers`` only changes how envs are sliced, which keeps group handling
identical to the parallel backends. It cannot enforce ``step_timeout`` (there is nobody to
interrupt a hung env) and an env that kills its process kills the caller; exceptions are
still isolated per env.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from typing import ClassVar

from turnpool.backends.base import Backend
from turnpool.pool.host import EnvHost
from turnpool.pool.protocol import Reply, Request


class SequentialBackend(Backend):
    """Runs each request to completion inside ``send``."""

    name: ClassVar[str] = "sequential"

    def start(self, timeout: float) -> None:
        self._hosts = [EnvHost(self.builds_of(k)) for k in range(self.num_workers)]
        self._replies: list[deque[Reply]] = [deque() for _ in self._hosts]

    def send(self, worker: int, request: Request) -> None:
        self._replies[worker].append(self._hosts[worker].handle(request))

    def wait(self, workers: Collection[int], timeout: float | None) -> list[int]:
        return [w for w in workers if self._replies[w]]

    def recv(self, worker: int) -> Reply:
        return self._replies[worker].popleft()

    def restart(self, worker: int) -> None:
        self._hosts[worker].close()
        self._hosts[worker] = EnvHost(self.builds_of(worker))
        self._replies[worker].clear()

    def close(self) -> None:
        for host in getattr(self, "_hosts", []):
            host.close()
        self._hosts = []
