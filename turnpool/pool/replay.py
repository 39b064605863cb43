"""The replay log: each env's episode seed and the turns it took since, per worker.

When a worker dies or is killed past its deadline, only the env it was running is to blame.
Its other envs are rebuilt in the replacement worker by reset (same seed) + replay of the
actions recorded since that reset (`Op.RESTORE`); deterministic envs make this exact, so
their results for the step are as if nothing happened. The log is compacted at every reset,
so it only holds the live episodes' turns. An env restored or forked mid-episode
(`turnpool.pool.branch`) keeps the turns that led there as its own prefix, before its mark.
The env table (`turnpool.pool.table.EnvTable`) holds one `ReplayLog` as its episode part; the
`Dispatcher` decides when to restore; this module only remembers.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

#: `ReplayLog.restore_items` looks up envs in each log entry by ``index`` up to this many.
_FEW = 4

class ReplayLog:
    """Episode seeds (`seeds`) and, per worker, the step requests it completed."""

    def __init__(self, slices: Sequence[Sequence[int]], num_envs: int) -> None:
        self._slices = [list(ids) for ids in slices]
        #: each env's current episode seed (None before its first reset or after a failure)
        self.seeds: list[int | None] = [None] * num_envs
        # Per worker, the step requests it completed ``(env_ids, actions, single)``, and per
        # env, where in its worker's log its current episode starts.
        self._log: list[list[tuple[Any, Any, bool]]] = [[] for _ in self._slices]
        self._mark = [0] * num_envs
        # Per env put in a mid-episode state (a restore or fork), the turns before its mark.
        self._prefix: dict[int, Sequence[Sequence[Any]]] = {}
        # Per worker, restores since its log was last compacted.
        self._restores = [0] * len(self._slices)

    def stepped(self, worker: int, env_ids: Sequence[int], actions: Sequence[Any],
                single: bool) -> None:
        """``worker`` completed a step request (one append per worker per step)."""
        self._log[worker].append((env_ids, actions, single))

    def started(self, worker: int, seeds: dict[int, int], broken: Collection[int]) -> None:
        """Envs of ``worker`` began episodes with these seeds (``broken``: the pool's failed
        envs, whose turns need not be kept)."""
        start = len(self._log[worker])
        for i, seed in seeds.items():
            self.seeds[i] = seed
            self._mark[i] = start
            self._prefix.pop(i, None)
        self._compact(worker, broken)

    def restored(self, worker: int, env_id: int, seed: int, turns: Sequence[Sequence[Any]],
                 broken: Collection[int]) -> None:
        """Env ``env_id`` of ``worker`` was put in the state of an episode of ``seed`` after
        ``turns`` (a restore or fork): recorded as that episode, so a lost worker brings it
        back by the same replay."""
        self.seeds[env_id] = seed
        self._mark[env_id] = len(self._log[worker])
        self._prefix[env_id] = turns  # kept aside: the worker's log does not grow per restore
        # A restore can only free entries older than every live episode; scanning the worker's
        # envs for that on every fork would make a fork linear in them, so it is done once
        # per as many restores as the worker has envs / 16 (the log grows by steps, not
        # restores, so this only delays freeing).
        self._restores[worker] += 1
        if self._restores[worker] * 16 >= len(self._slices[worker]):
            self._compact(worker, broken)

    def mark(self, env_id: int) -> int:
        """Where env ``env_id``'s episode starts in its worker's log."""
        return self._mark[env_id]

    def held(self, worker: int) -> int:
        """How many step requests the log keeps for ``worker``."""
        return len(self._log[worker])

    def forget(self, worker: int, env_ids: Collection[int], broken: Collection[int]) -> None:
        """The caller is done with these envs' episodes (a released slot): no seed, so they
        are not restored, and their turns no longer hold the worker's log back."""
        for i in env_ids:
            self.seeds[i] = None
            self._prefix.pop(i, None)
        self._compact(worker, broken)

    def restore_items(self, worker: int, env_ids: list[int]
                      ) -> list[tuple[int, int, list[Any]]]:
        """`Op.RESTORE` items ``(env_id, seed, turns)`` bringing back ``env_ids`` (which must
        have a seed) as they are now."""
        turns: dict[int, list[Any]] = {i: list(self._prefix.get(i, ())) for i in env_ids}
        if env_ids:
            log = self._log[worker]
            start = min(self._mark[i] for i in env_ids)
            if len(env_ids) <= _FEW:
                self._few_turns(log, start, env_ids, turns)
            else:
                for index in range(start, len(log)):
                    ids, actions, single = log[index]
                    for i, acts in zip(ids, actions):
                        if i in turns and index >= self._mark[i]:
                            turns[i].append([acts] if single else acts)
        out: list[tuple[int, int, list[Any]]] = []
        for i in env_ids:
            seed = self.seeds[i]
            assert seed is not None
            out.append((i, seed, turns[i]))
        return out

    def _few_turns(self, log: list[tuple[Any, Any, bool]], start: int, env_ids: list[int],
                   turns: dict[int, list[Any]]) -> None:
        """`restore_items` for a few envs (a snapshot): each entry's position of an env is
        found by ``ids.index`` (C speed), not by walking every env of a whole-pool step."""
        marks = [(i, self._mark[i]) for i in env_ids]
        for index in range(start, len(log)):
            ids, actions, single = log[index]
            for i, mark in marks:
                if index < mark:
                    continue
                try:
                    pos = ids.index(i)
                except ValueError:
                    continue
                turns[i].append([actions[pos]] if single else actions[pos])

    def _compact(self, worker: int, broken: Collection[int]) -> None:
        """Forget log entries older than every live episode of the worker."""
        self._restores[worker] = 0
        live = [self._mark[i] for i in self._slices[worker]
                if self.seeds[i] is not None and i not in broken]
        cut = min(live) if live else len(self._log[worker])
        if cut:
            del self._log[worker][:cut]
            for i in self._slices[worker]:
                self._mark[i] = max(0, self._mark[i] - cut)
