"""Starting child processes (pool workers, serve's fronts) so that a terminal's Ctrl-C,
which reaches the whole process group, cannot kill one while its interpreter starts."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import resource_tracker


@contextmanager
def sigint_blocked(method: str) -> Iterator[None]:
    """SIGINT blocked in this thread for the block: children started in it start blocked.

    A terminal's Ctrl-C reaches the whole process group: a child whose interpreter is still
    starting would die of it ("Fatal Python error") before its own code could ignore it; it
    unblocks SIGINT once it handles it. The mask survives fork and the spawn's exec. The
    signal stays this process's, delivered when the mask is restored. Spawn and forkserver
    start multiprocessing's resource tracker on their first start and unblock SIGINT in this
    thread right after, so the tracker is started first.
    """
    if method != "fork":
        resource_tracker.ensure_running()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
