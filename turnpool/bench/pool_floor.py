"""The floor under every process pool on this machine: `BarePipes`, the benchmark's
``bare_pipes`` reference row.

`BarePipes` steps the same envs as the pool's ``process`` backend, split the same way over
the same number of worker processes, with the least a process pool can do: one pickled list
of actions per worker over a pipe, ``env.step`` on each, one pickled list of results back,
and the four lists `EnvPool.step` returns. It has none of the pool's safety: no deadlines,
no progress record, no hand-off, no recovery, no replay log, no error capture (an env that
raises ends its worker). It is not a backend and nothing but `turnpool bench pool` uses it;
it answers one question side by side: what would any pool of processes and pipes cost here?
A goal below this row cannot be met on this machine by cutting the pool's own work.

    >>> floor = BarePipes("trivial", {"episode_len": 5}, num_envs=4, num_workers=2)
    >>> obs = floor.reset()
    >>> len(obs), len(floor.step([1, 2, 3, 4])[0])
    (4, 4)
    >>> floor.close()
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
from typing import Any

from turnpool.envs.registry import make
from turnpool.worker.build import split_evenly
from turnpool.worker.transport import PROTOCOL, watch_parent

#: Seconds `BarePipes.close` waits for a worker to exit before killing it.
_JOIN_S = 2.0


def _serve(inbox: multiprocessing.connection.Connection,
           outbox: multiprocessing.connection.Connection,
           env_type: str, kwargs: dict[str, Any], seeds: list[int], owner: int) -> None:
    """A bare worker: reset / step its envs until ``None`` arrives or its owner is gone.

    A forked worker holds its own request pipe's write end (and its elder siblings'), so the
    pipe never reads EOF when the owner dies: it dies with its owner instead (`watch_parent`,
    a thread that sleeps between checks; nothing on the step path)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the benchmark's to handle
    watch_parent(owner, die_with_parent=True)
    envs = [make(env_type, **kwargs) for _ in seeds]
    while True:
        try:
            request = pickle.loads(inbox.recv_bytes())
        except (EOFError, OSError):
            return
        if request is None:
            return
        if request == "reset":
            reply: Any = [env.reset(seed=s)[0] for env, s in zip(envs, seeds)]
        else:
            reply = [env.step(a) for env, a in zip(envs, request)]
        outbox.send_bytes(pickle.dumps(reply, PROTOCOL))


class BarePipes:
    """``num_envs`` (at least one) envs in ``num_workers`` forked processes, in the slices
    the ``process`` backend gives its workers; env ``i`` resets with seed ``i``."""

    def __init__(self, env_type: str, kwargs: dict[str, Any], num_envs: int,
                 num_workers: int) -> None:
        ctx = multiprocessing.get_context("fork")
        self._slices = [(ids[0], ids[-1] + 1)
                        for ids in split_evenly(range(num_envs), num_workers)]
        self.num_workers = len(self._slices)
        self._pipes: list[tuple[multiprocessing.connection.Connection,
                                multiprocessing.connection.Connection]] = []
        self._procs: list[Any] = []
        for lo, hi in self._slices:
            req_r, req_w = ctx.Pipe(duplex=False)
            rep_r, rep_w = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_serve, name="turnpool-bare-pipes", daemon=True,
                               args=(req_r, rep_w, env_type, kwargs, list(range(lo, hi)),
                                     os.getpid()))
            proc.start()
            req_r.close()
            rep_w.close()
            self._pipes.append((req_w, rep_r))
            self._procs.append(proc)

    def _round(self, requests: list[Any]) -> list[Any]:
        for (out, _), request in zip(self._pipes, requests):
            out.send_bytes(pickle.dumps(request, PROTOCOL))
        rows: list[Any] = []
        for _, inbox in self._pipes:
            rows += pickle.loads(inbox.recv_bytes())
        return rows

    def reset(self) -> list[str]:
        return self._round(["reset"] * len(self._pipes))

    def step(self, actions: list[Any]
             ) -> tuple[list[str], list[float], list[bool], list[dict[str, Any]]]:
        """One action per env; the lists `EnvPool.step` returns."""
        rows = self._round([actions[lo:hi] for lo, hi in self._slices])
        obs, rewards, terminated, truncated, infos = zip(*rows)
        return (list(obs), list(rewards), [a or b for a, b in zip(terminated, truncated)],
                list(infos))

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        for out, _ in self._pipes:
            try:
                out.send_bytes(pickle.dumps(None, PROTOCOL))
            except OSError:
                pass
        for proc in self._procs:
            proc.join(_JOIN_S)
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGKILL)
                proc.join(_JOIN_S)
        for out, inbox in self._pipes:
            out.close()
            inbox.close()
        self._pipes.clear()
        self._procs.clear()


__all__ = ["BarePipes"]
