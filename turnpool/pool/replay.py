"""Replay: the log of each worker's completed steps, and recovery of a lost worker's envs.

When a worker dies or is killed past its deadline, only the env it was running is to blame.
Its other envs are rebuilt in the replacement worker by reset (same seed) + replay of the
actions recorded since that reset; deterministic envs make this exact, so their results for
the step are as if nothing happened. The log is compacted at every reset, so it only holds
the live episodes' turns.
"""

from __future__ import annotations

import logging
from typing import Any

from turnpool.backends.base import Backend
from turnpool.pool.dispatch import Dispatcher, Pending
from turnpool.worker.protocol import BackendUnavailable, WorkerLost

log = logging.getLogger(__name__)


class Replaying(Dispatcher):
    """A `Dispatcher` that logs completed steps and restores innocent envs after a fault."""

    def attach(self, backend: Backend, num_envs: int) -> None:
        super().attach(backend, num_envs)
        # Per worker, the step requests it completed, and per env, where in its worker's
        # log its current episode starts.
        self._log: list[list[tuple[Any, Any, bool]]] = [[] for _ in backend.slices]
        self._mark = [0] * num_envs

    def _step_done(self, worker: int, head: Pending) -> None:
        self._log[worker].append((head.env_ids, head.items[1], head.op == "step1"))

    def _reset_done(self, worker: int, started: list[int]) -> None:
        start = len(self._log[worker])
        for i in started:
            self._mark[i] = start
        self._compact_log(worker)

    def _recover(self, worker: int, reason: str, failure: str) -> None:
        """Replace a dead or stuck worker; flag the env it was running, bring back the rest.

        The env running when the worker died is known from the backend's progress marker;
        if it is unknown, every env of the request is flagged. The worker's other envs are
        rebuilt by reset + replay of the actions recorded since their reset, then the
        unfinished part of the request is sent again.
        """
        queue = self._queues[worker]
        head = queue.popleft()
        progress = self._backend.progress(worker)
        culprit = int(progress[0]) if progress is not None else -1
        log.warning("worker %d of %s backend: %s (env %s); restarting it", worker,
                    self._backend.name, reason, culprit if culprit >= 0 else "unknown")
        try:
            self._backend.restart(worker)
        except (BackendUnavailable, OSError, WorkerLost) as exc:
            # Without a worker its envs cannot run: fail them all, keep the pool consistent.
            log.error("restarting worker %d failed: %s", worker, exc)
            for pending in [head, *queue]:
                for k, i in enumerate(pending.env_ids):
                    self._fail(pending, k, i, f"{reason}; restart failed: {exc}", failure)
            queue.clear()
            for i in self._backend.slices[worker]:
                if i not in self._broken:
                    self._broken[i] = f"worker lost: {exc}"
                    self._failure[i] = "worker_lost"
            return
        if culprit in head.env_ids:
            guilty = [culprit]
        elif (progress is not None and failure == "worker_lost" and not head.retried
              and head.op != "restore"):
            # It died between envs (killed from outside, e.g. with a sibling worker): no env
            # is to blame; the request is sent again once.
            guilty = []
        else:  # unknown culprit: flag the whole request rather than risk a loop
            guilty = list(head.env_ids)
        for i in guilty:
            self._fail(head, head.env_ids.index(i), i, reason, failure)
        rest: list[Pending] = []
        if head.op != "restore":
            keep = [k for k, i in enumerate(head.env_ids) if i not in guilty]
            if keep:
                items: Any
                if head.op == "reset":
                    items = _regroup(head.items, {head.env_ids[k] for k in keep})
                    env_ids = [i for _, members in items for i in members]
                else:
                    env_ids = [head.env_ids[k] for k in keep]
                    items = (env_ids, [head.items[1][k] for k in keep])
                pos_of = dict(zip(head.env_ids, head.positions))
                seeds = None
                if head.seeds is not None:
                    seed_of = dict(zip(head.env_ids, head.seeds))
                    seeds = [seed_of[i] for i in env_ids]
                retry = Pending(head.op, env_ids, items, head.ticket,
                                [pos_of[i] for i in env_ids], seeds)
                retry.retried = True
                rest.append(retry)
        waiting = list(queue)
        queue.clear()
        resetting = {i for p in (*rest, *waiting) if p.op == "reset" for i in p.env_ids}
        wanted = [i for i in self._backend.slices[worker]
                  if self._seeds[i] is not None and i not in self._broken and i not in resetting]
        turns = self._turns_since_reset(worker, wanted)
        restore = [(i, self._seeds[i], turns[i]) for i in wanted]
        if restore:
            queue.append(Pending("restore", [r[0] for r in restore], restore, None, []))
        queue.extend(rest)
        queue.extend(waiting)
        if queue:
            self._send(worker, queue[0])

    def _turns_since_reset(self, worker: int, env_ids: list[int]) -> dict[int, list[Any]]:
        """Each env's turns since its reset, from its worker's log (for replay)."""
        turns: dict[int, list[Any]] = {i: [] for i in env_ids}
        if not env_ids:
            return turns
        log = self._log[worker]
        for index in range(min(self._mark[i] for i in env_ids), len(log)):
            ids, actions, single = log[index]
            for i, acts in zip(ids, actions):
                if i in turns and index >= self._mark[i]:
                    turns[i].append([acts] if single else acts)
        return turns

    def _compact_log(self, worker: int) -> None:
        """Forget log entries older than every live episode of the worker."""
        live = [self._mark[i] for i in self._backend.slices[worker]
                if self._seeds[i] is not None and i not in self._broken]
        cut = min(live) if live else len(self._log[worker])
        if cut:
            del self._log[worker][:cut]
            for i in self._backend.slices[worker]:
                self._mark[i] = max(0, self._mark[i] - cut)


def _regroup(items: list[tuple[int, list[int]]], keep: set[int]) -> list[tuple[int, list[int]]]:
    """Reset items restricted to ``keep`` (a group whose leader failed gets a new leader)."""
    out = []
    for seed, members in items:
        kept = [i for i in members if i in keep]
        if kept:
            out.append((seed, kept))
    return out
