"""Sequential backend: every worker's `EnvHost` runs in the caller, one after the other.

The floor for microsecond envs (no hand-off at all) and the fallback when a parallel backend
cannot start. ``num_workers`` only changes how envs are sliced, which keeps group handling
identical to the parallel backends. ``step_timeout`` is enforced in-process
(`turnpool.worker.deadline`): an env past its budget gets an exception raised inside its own
code and is flagged ``"timeout"``; a hang inside C code cannot be stopped this way (use a
process backend for such envs). An env that kills its process kills the caller; exceptions
are still isolated per env.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from typing import ClassVar

from turnpool.backends.base import Backend, raise_build_errors
from turnpool.worker.deadline import TIMED_OUT, InProcessDeadline, StepInterrupted
from turnpool.worker.host import EnvHost
from turnpool.worker.protocol import Reply, Request, failed_reply


class SequentialBackend(Backend):
    """Runs each request to completion inside ``send``."""

    name: ClassVar[str] = "sequential"

    def start(self, timeout: float) -> None:
        self._deadline = InProcessDeadline()
        self._hosts = [EnvHost(self.builds_of(k), self._deadline.mark)
                       for k in range(self.num_workers)]
        self._replies: list[deque[Reply]] = [deque() for _ in self._hosts]
        errors = {i: e for h in self._hosts for i, e in h.build_errors.items()}
        if errors:
            self.close()
        raise_build_errors(errors)

    def send(self, worker: int, request: Request) -> None:
        self._deadline.begin(request[1].limit(self.step_timeout, self.reset_timeout))
        try:
            reply = self._hosts[worker].handle(request)
        except StepInterrupted:  # fired between two envs: the request as a whole timed out
            reply = failed_reply(request, TIMED_OUT, "timeout")
        finally:
            self._deadline.end()
        self._replies[worker].append(reply)

    def wait(self, workers: Collection[int], timeout: float | None) -> list[int]:
        return [w for w in workers if self._replies[w]]

    def recv(self, worker: int) -> Reply:
        return self._replies[worker].popleft()

    def restart(self, worker: int) -> None:
        self._hosts[worker].close()
        self._hosts[worker] = EnvHost(self.builds_of(worker), self._deadline.mark)
        self._replies[worker].clear()

    def close(self) -> None:
        for host in getattr(self, "_hosts", []):
            host.close()
        self._hosts = []
        deadline = getattr(self, "_deadline", None)
        if deadline is not None:
            deadline.close()
