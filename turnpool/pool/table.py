"""The env table: the one home of every env's pool-side state, owned by the `Dispatcher`.

One record per env (`EnvRecord`): the worker that owns it, its episode seed and where its
episode starts in the replay log (the `ReplayLog` is the table's episode part), and its
status: idle, in flight (sent by `step_async` / `reset_async`, result not polled yet),
straggling (its worker answered its request without it, `Op.PARTIAL`) or failed, with the
reason and class, until its next reset. The table changes only through its methods, one per
change (its columns are private): the dispatcher's as replies and faults arrive, the pool's
API as it hands ready results out (`take_ready`) or forgets envs (`forget`), branching as it
restores an env (`restored`, or `fail`); the slot engine asks the pool (`EnvPool.owner_of`),
which asks the table (`owner_of`, `record`, `seeds`, `busy`). A synchronous call hands its
results back before it returns, so its envs are never seen in flight.

Storage is by column (an owner list, a failed dict, an in-flight set, per-worker straggler
maps), so the hot path of a whole-pool step does no per-env work; `record` assembles a row.

>>> table = EnvTable([[0, 1], [2]], 3)
>>> table.started(0, {0: 5, 1: 5})
>>> table.fail(1, "ValueError: boom", Failure.ENV_ERROR)
>>> table.record(1).status, table.record(1).failure, table.owner_of(2), table.seeds[0]
(<Status.FAILED: 'failed'>, <Failure.ENV_ERROR: 'env_error'>, 1, 5)
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from turnpool.pool.replay import ReplayLog
from turnpool.pool.requests import Straggler
from turnpool.worker.failures import Failure
from turnpool.worker.results import ResetResult, TurnResult


class Status(enum.Enum):
    """Where an env stands, as the pool sees it."""

    IDLE = "idle"
    IN_FLIGHT = "in flight"
    STRAGGLING = "straggling"
    FAILED = "failed"


@dataclass(frozen=True)
class EnvRecord:
    """One env's row of the table (a snapshot)."""

    env_id: int
    owner: int
    #: episode seed (None before its first reset, after a failed reset or `EnvTable.forget`)
    seed: int | None
    #: where its episode starts in its worker's replay log
    mark: int
    status: Status
    #: why it failed and the class, when ``status`` is FAILED
    reason: str | None = None
    failure: Failure | None = None


class EnvTable:
    """Every env's owner, episode (seed + replay), flight and failure state.

    Its columns are private: every change is one of the methods below, so what the table
    says is what its owner did to it. The readers' views (`owners`, `failed`, `in_flight`,
    `ready`, `stragglers`, `replay`) are the live containers, typed read-only: the hot path
    reads them without a copy.
    """

    def __init__(self, slices: Sequence[Sequence[int]], num_envs: int) -> None:
        self._slices = [list(ids) for ids in slices]
        self._owner = [0] * num_envs
        for w, ids in enumerate(self._slices):
            for i in ids:
                self._owner[i] = w
        self._replay = ReplayLog(self._slices, num_envs)
        #: failed envs (until their next reset) -> why, and their class
        self._failed: dict[int, str] = {}
        self._failure: dict[int, Failure] = {}
        #: env ids of async calls not polled yet, and the finished ones (ready first)
        self._in_flight: set[int] = set()
        self._ready: list[tuple[int, TurnResult | ResetResult]] = []
        #: per worker, env id -> its `Straggler`
        self._stragglers: list[dict[int, Straggler]] = [{} for _ in self._slices]

    # ------------------------------------------------------------------ queries
    def owner_of(self, env_id: int) -> int:
        """The worker that holds env ``env_id`` (fixed for the pool's life)."""
        return self._owner[env_id]

    @property
    def owners(self) -> Sequence[int]:
        """Each env's worker (`owner_of` of every env at once, for request building)."""
        return self._owner

    @property
    def seeds(self) -> Sequence[int | None]:
        """Each env's episode seed (None: no episode)."""
        return self._replay.seeds

    @property
    def failed(self) -> Mapping[int, str]:
        """The failed envs (until their next reset) and why."""
        return self._failed

    @property
    def in_flight(self) -> AbstractSet[int]:
        """Env ids of async calls whose results were not taken yet (`take_ready`)."""
        return self._in_flight

    @property
    def ready(self) -> Sequence[tuple[int, TurnResult | ResetResult]]:
        """The finished results of async calls, in the order they finished."""
        return self._ready

    @property
    def stragglers(self) -> Sequence[Mapping[int, Straggler]]:
        """Per worker, its stragglers by env id."""
        return self._stragglers

    @property
    def replay(self) -> ReplayLog:
        """The episode part (read it: `ReplayLog.held`, `ReplayLog.mark`; the table writes it)."""
        return self._replay

    def failure_of(self, env_id: int) -> Failure:
        return self._failure.get(env_id, Failure.ENV_ERROR)

    def busy(self, env_ids: Iterable[int]) -> set[int]:
        """The envs of ``env_ids`` in flight."""
        return self._in_flight.intersection(env_ids)

    def live(self, worker: int) -> list[int]:
        """The envs of ``worker`` that are in an episode and not failed (what a replacement
        worker must restore), in slice order."""
        seeds, failed = self._replay.seeds, self._failed
        return [i for i in self._slices[worker] if seeds[i] is not None and i not in failed]

    def restore_items(self, worker: int, env_ids: list[int]
                      ) -> list[tuple[int, int, list[Any]]]:
        """``(env_id, seed, turns)`` of each of ``env_ids`` (all of ``worker``): what brings
        their episodes back on a fresh instance."""
        return self._replay.restore_items(worker, env_ids)

    def record(self, env_id: int) -> EnvRecord:
        """Env ``env_id``'s row."""
        owner = self._owner[env_id]
        reason = self._failed.get(env_id)
        if reason is not None:
            status = Status.FAILED
        elif env_id in self._stragglers[owner]:
            status = Status.STRAGGLING
        elif env_id in self._in_flight:
            status = Status.IN_FLIGHT
        else:
            status = Status.IDLE
        return EnvRecord(env_id, owner, self._replay.seeds[env_id], self._replay.mark(env_id),
                         status, reason, self.failure_of(env_id) if reason is not None else None)

    # ------------------------------------------------------------------ changes
    def fail(self, env_id: int, reason: str, failure: Failure, episode_lost: bool = False
             ) -> None:
        """Env ``env_id`` failed (``episode_lost``: at a reset, so it has no episode)."""
        self._failed[env_id] = reason
        self._failure[env_id] = failure
        if episode_lost:
            self._replay.seeds[env_id] = None

    def started(self, worker: int, seeds: dict[int, int]) -> None:
        """Envs of ``worker`` began episodes with these seeds (and are no longer failed)."""
        for i in seeds:
            self._failed.pop(i, None)
        self._replay.started(worker, seeds, self._failed)

    def restored(self, env_id: int, seed: int, turns: Sequence[Sequence[Any]]) -> None:
        """Env ``env_id`` now plays an episode of ``seed`` after ``turns`` (a restore or a
        fork); it is no longer failed."""
        self._failed.pop(env_id, None)
        self._replay.restored(self._owner[env_id], env_id, seed, turns, self._failed)

    def stepped(self, worker: int, env_ids: Sequence[int], actions: Sequence[Any],
                single: bool) -> None:
        """``worker`` completed these envs' turns (one replay-log append)."""
        self._replay.stepped(worker, env_ids, actions, single)

    def forget(self, env_ids: Sequence[int]) -> None:
        """Drop these envs' episodes: no seed (never restored), no turns kept."""
        by_worker: dict[int, list[int]] = {}
        for i in env_ids:
            by_worker.setdefault(self._owner[i], []).append(i)
        for w, ids in by_worker.items():
            self._replay.forget(w, ids, self._failed)

    def worker_gone(self, worker: int, reason: str) -> None:
        """``worker`` could not be replaced: every env of it not failed yet fails."""
        for i in self._slices[worker]:
            if i not in self._failed:
                self.fail(i, reason, Failure.WORKER_LOST)

    def sent_async(self, env_ids: Iterable[int]) -> None:
        """These envs' async call went out: in flight until their results are taken."""
        self._in_flight.update(env_ids)

    def finished_async(self, env_id: int, result: TurnResult | ResetResult) -> None:
        """Env ``env_id``'s async call finished: its result is ready (still in flight)."""
        self._ready.append((env_id, result))

    def straggling(self, worker: int, env_id: int, straggler: Straggler) -> None:
        """``worker`` answered env ``env_id``'s request without it: its result comes later."""
        self._stragglers[worker][env_id] = straggler

    def straggler_done(self, worker: int, env_id: int, seq: int) -> Straggler | None:
        """Env ``env_id``'s late result of request ``seq`` arrived: its `Straggler`, no longer
        straggling; None for a stale one (not a straggler of that request)."""
        late = self._stragglers[worker]
        straggler = late.get(env_id)
        if straggler is None or straggler.head.seq != seq:
            return None
        del late[env_id]
        return straggler

    def drop_stragglers(self, worker: int) -> list[Straggler]:
        """``worker`` is being replaced: its stragglers, none left (recovery decides)."""
        late = list(self._stragglers[worker].values())
        self._stragglers[worker] = {}
        return late

    def take_ready(self, hold_if_failed: bool
                   ) -> tuple[list[tuple[int, Any]], list[tuple[int, Any]]]:
        """``(taken, failed)``: the finished results, no longer in flight. ``hold_if_failed``
        and some failed: only the failed ones are taken (returned as ``failed``), the others
        stay ready and in flight (the caller raises for the failed ones)."""
        out, self._ready = self._ready, []
        if hold_if_failed and any(r.error is not None for _, r in out):
            self._ready = [x for x in out if x[1].error is None]
            failed = [x for x in out if x[1].error is not None]
            self._in_flight.difference_update(i for i, _ in failed)
            return [], failed
        self._in_flight.difference_update(i for i, _ in out)
        return out, []
