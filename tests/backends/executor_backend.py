"""A backend defined outside turnpool, to prove that adding one is one file + one registry line.

Each worker is a one-thread executor whose `EnvHost` holds the worker's slice; a reply is the
future of the request, so ready-first waiting is `concurrent.futures.wait` on the heads.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections import deque
from collections.abc import Collection
from typing import ClassVar

from turnpool.backends.base import Backend
from turnpool.worker.host import EnvHost
from turnpool.worker.protocol import Reply, Request


class ExecutorBackend(Backend):
    """``num_workers`` single-thread executors in the caller's process."""

    name: ClassVar[str] = "executor"

    def start(self, timeout: float) -> None:
        self._hosts = [EnvHost(self.builds_of(k)) for k in range(self.num_workers)]
        self._threads = [cf.ThreadPoolExecutor(1) for _ in self._hosts]
        self._pending: list[deque[cf.Future[Reply]]] = [deque() for _ in self._hosts]

    def send(self, worker: int, request: Request) -> None:
        host = self._hosts[worker]
        self._pending[worker].append(self._threads[worker].submit(host.handle, request))

    def wait(self, workers: Collection[int], timeout: float | None) -> list[int]:
        heads = {self._pending[w][0]: w for w in workers if self._pending[w]}
        done, _ = cf.wait(heads, timeout, return_when=cf.FIRST_COMPLETED)
        return sorted(heads[f] for f in done)

    def recv(self, worker: int) -> Reply:
        return self._pending[worker].popleft().result()

    def restart(self, worker: int) -> None:
        self._threads[worker].shutdown(wait=False, cancel_futures=True)
        self._hosts[worker] = EnvHost(self.builds_of(worker))
        self._threads[worker] = cf.ThreadPoolExecutor(1)
        self._pending[worker].clear()

    def close(self) -> None:
        for threads, host in zip(getattr(self, "_threads", []), getattr(self, "_hosts", [])):
            threads.submit(host.close)
            threads.shutdown(wait=True)
        self._threads, self._hosts = [], []
