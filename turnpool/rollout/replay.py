"""Replay a record (`turnpool.rollout.record`): re-run every env transition and compare it
with what was recorded, byte for byte (``turnpool replay FILE``).

The replay rebuilds the recorded pool layout (the header's specs and ``group_n``) on any
backend, so env ``i`` is built exactly as it was, and plays the record in waves: a wave takes
episode lines in file order while their env ids are distinct (a batch of the run is one wave,
its retries the next). A wave's envs are reset with their recorded seeds (one ``reset`` call
per seed base, i.e. per recorded batch), then stepped depth by depth: the ``k``-th recorded
step of every episode that has one goes into one pool call (`step_runs`: ``step_turns``, or
one action per call under RAGEN v2, merged as the collector merged them). No policy runs: the
actions come from the file, which is what makes an async run replayable at all, and what
makes a replay run at env speed.

Each reset and each step is compared field by field (`RESET_FIELDS`, `STEP_FIELDS`) in
canonical JSON; an episode stops at its first divergence (the env's later transitions follow
from a different state). What cannot be compared is counted, not judged: the steps from a
recorded failure that says more about the run than about the env (a timeout, a lost worker, a
sandbox failure: the retryable classes of `turnpool.worker.failures.Failure`) on, and an
episode whose reset failed in the run (no seed). An env that raised (``env_error``) is
deterministic and compared like any other step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turnpool.pool import EnvPool
from turnpool.rollout.episode import step_runs
from turnpool.rollout.record import (
    RESET_FIELDS,
    STEP_FIELDS,
    EpisodeRecord,
    RecordError,
    RecordHeader,
    read_record,
    reset_fields,
    step_fields,
)
from turnpool.rollout.trajectory import canonical
from turnpool.worker.failures import Failure

#: characters of a recorded or replayed value a divergence report shows
SHOWN_CHARS = 120


@dataclass(frozen=True)
class Divergence:
    """The first field of an episode's transition that replayed differently."""

    episode: int
    line: int
    env_id: int
    tag: str
    env_type: str
    seed: int
    turn: int | None  # None: the reset
    field: str
    recorded: Any
    replayed: Any

    def describe(self) -> str:
        """One line: where (episode, env, seed, turn), which field, recorded vs replayed."""
        where = "reset" if self.turn is None else f"turn {self.turn}"
        return (f"episode {self.episode} (line {self.line}; env {self.env_id}, "
                f"{self.env_type}, tag {self.tag}, seed {self.seed}), {where}: {self.field} "
                f"recorded {shorten(self.recorded)}, replayed {shorten(self.replayed)}")


@dataclass
class ReplayReport:
    """What a replay found. ``transitions`` counts the resets and steps compared,
    ``not_compared`` those left out (see the module docstring), ``divergent`` the episodes
    with a divergence and ``first`` the earliest of them in the file."""

    header: RecordHeader
    backend: str = ""
    num_workers: int = 0
    episodes: int = 0
    transitions: int = 0
    not_compared: int = 0
    divergent: int = 0
    first: Divergence | None = None
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.divergent == 0

    @property
    def transitions_per_s(self) -> float:
        return self.transitions / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"episodes": self.episodes, "transitions": self.transitions,
                "not_compared": self.not_compared, "divergent_episodes": self.divergent,
                "first_divergence": self.first.describe() if self.first else None,
                "wall_s": self.wall_s, "transitions_per_s": self.transitions_per_s,
                "backend": self.backend, "num_workers": self.num_workers,
                "recorded_with": self.header.turnpool,
                "collector_mode": self.header.collector_mode}


def replay(path: str | Path, *, backend: str = "sequential", num_workers: int | None = None,
           on_wave: Callable[[ReplayReport], None] | None = None,
           **pool_options: Any) -> ReplayReport:
    """Replay the record at ``path`` on a fresh pool (``backend``, ``num_workers`` and
    ``pool_options`` as `EnvPool` takes them) and return the report; ``on_wave`` sees it
    after each wave. RecordError for a file that is not a record or contradicts its own
    header; the pool's own errors (`turnpool.pool.api.EnvConstructionError`, ...) as raised."""
    start = time.perf_counter()
    header, records = read_record(path)
    return replay_records(header, records, backend=backend, num_workers=num_workers,
                          on_wave=on_wave, started=start, **pool_options)


def replay_records(header: RecordHeader, records: Iterator[EpisodeRecord], *,
                   backend: str = "sequential", num_workers: int | None = None,
                   on_wave: Callable[[ReplayReport], None] | None = None,
                   started: float | None = None, **pool_options: Any) -> ReplayReport:
    """`replay` of a record already opened (`read_record`); closes ``records``.
    ``started``: the `time.perf_counter` the report's ``wall_s`` counts from (default:
    now)."""
    start = time.perf_counter() if started is None else started
    try:
        pool = EnvPool.from_specs(header.specs, group_n=header.group_n, backend=backend,
                                  num_workers=num_workers, **pool_options)
        report = ReplayReport(header, backend=pool.backend_name, num_workers=pool.num_workers)
        with pool:
            for wave in waves(records):
                _replay_wave(pool, wave, header, report)
                if on_wave is not None:
                    on_wave(report)
    finally:
        _close(records)
    report.wall_s = time.perf_counter() - start
    return report


def waves(records: Iterable[EpisodeRecord]) -> Iterator[list[EpisodeRecord]]:
    """Consecutive episode lines with distinct env ids, in file order.

    >>> def rec(env_id: int) -> EpisodeRecord:
    ...     return EpisodeRecord(0, env_id, "t", "bandit", 0, {}, [], 0)
    >>> [[r.env_id for r in w] for w in waves(rec(i) for i in (0, 1, 2, 1, 0, 0))]
    [[0, 1, 2], [1, 0], [0]]
    """
    wave: list[EpisodeRecord] = []
    ids: set[int] = set()
    for rec in records:
        if rec.env_id in ids:
            yield wave
            wave, ids = [], set()
        wave.append(rec)
        ids.add(rec.env_id)
    if wave:
        yield wave


def _replay_wave(pool: EnvPool, wave: list[EpisodeRecord], header: RecordHeader,
                 report: ReplayReport) -> None:
    gids = pool.group_ids
    by_base: dict[int, list[EpisodeRecord]] = {}
    for rec in wave:
        report.episodes += 1
        if pool.tags[rec.env_id] != rec.tag or pool.env_types[rec.env_id] != rec.env_type:
            raise RecordError(f"line {rec.line}: env {rec.env_id} is {rec.env_type} (tag "
                              f"{rec.tag}) here, but {pool.env_types[rec.env_id]} (tag "
                              f"{pool.tags[rec.env_id]}) in the record's header")
        if rec.seed is None:  # its reset failed in the run: nothing to start from
            report.not_compared += 1 + len(rec.steps)
            continue
        by_base.setdefault(rec.seed - gids[rec.env_id], []).append(rec)
    live: list[EpisodeRecord] = []
    for base, recs in by_base.items():
        obs, infos = pool.reset(seed=base, env_ids=[r.env_id for r in recs])
        for rec, o, info in zip(recs, obs, infos):
            if _same(report, rec, None, rec.reset, reset_fields(o, info), RESET_FIELDS):
                live.append(rec)
    depth = 0
    while live:
        now: list[EpisodeRecord] = []
        for rec in live:
            if depth >= len(rec.steps):
                continue
            step = rec.steps[depth]
            if step["error"] is not None and Failure.of(step["failure"]).retryable:
                report.not_compared += len(rec.steps) - depth  # the run's fault, not the env's
                continue
            now.append(rec)
        results = step_runs(pool, [(r.env_id, list(r.steps[depth]["actions"])) for r in now],
                            singly=header.singly)
        live = []
        for rec, result in zip(now, results):
            assert result is not None  # every recorded step has actions
            step = rec.steps[depth]
            if _same(report, rec, step["turn"], step, step_fields(result), STEP_FIELDS):
                live.append(rec)
        depth += 1


def _same(report: ReplayReport, rec: EpisodeRecord, turn: int | None,
          recorded: dict[str, Any], replayed: dict[str, Any], fields: tuple[str, ...]) -> bool:
    """Compare one transition; count it, and note a divergence (False) if any field differs."""
    report.transitions += 1
    for name in fields:
        if not same_json(recorded[name], replayed[name]):
            report.divergent += 1
            if report.first is None or rec.line < report.first.line:
                assert rec.seed is not None
                report.first = Divergence(rec.episode, rec.line, rec.env_id, rec.tag,
                                          rec.env_type, rec.seed, turn, name, recorded[name],
                                          replayed[name])
            return False
    return True


def same_json(a: Any, b: Any) -> bool:
    """Do plain JSON values ``a`` and ``b`` have the same canonical JSON text? Scalars are
    compared by type and value (a float by its shortest repr, so ``0.0`` and ``-0.0``
    differ, as their texts do) without writing them out; the hot path of a replay.

    >>> same_json(1.0, 1.0), same_json(1, 1.0), same_json(0.0, -0.0), same_json([1], [1])
    (True, False, False, True)
    """
    kind = type(a)
    if kind is not type(b):
        return False
    if kind is str or kind is bool or kind is int or a is None:
        return bool(a == b)
    if kind is float:
        return repr(a) == repr(b)
    return canonical(a) == canonical(b)


def shorten(value: Any, limit: int = SHOWN_CHARS) -> str:
    """``value`` as canonical JSON, cut to ``limit`` characters (middle elided).

    >>> shorten("x" * 10, limit=8)
    '"xx…xxx"'
    """
    text = canonical(value)
    if len(text) <= limit:
        return text
    head = (limit - 1) // 2
    return text[:head] + "…" + text[len(text) - (limit - 1 - head):]


def _close(records: Iterator[EpisodeRecord]) -> None:
    close = getattr(records, "close", None)
    if close is not None:
        close()
