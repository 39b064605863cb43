"""Durable sessions: ``turnpool serve --state-dir DIR`` journals every session
(`turnpool.serve.journal`) and, when started again on the same directory, resumes each one
before it serves: same session id, same kind, its env at the last step its client was
answered.

An env is rebuilt by reset + replay through the slot engine: each session leases a slot,
every reset goes out as one engine submission, then turn ``k`` of every session still
replaying as one more (one pool call per round, whatever the number of sessions), so a
restart costs the longest episode's number of rounds. Replay is exact because the pool is:
a reset to seed ``s`` starts the env as ``make(env).reset(seed=s)`` on any slot, and the
same actions give the same turns. A WebSocket client comes back on
``/ws?session_id=ID``; an HTTP or MCP client just goes on with its ``session_id``. A session
whose client does not come back within ``http_session_timeout`` is closed.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turnpool.pool.slots import PoolFull, ResetSlotRequest, StepSlotRequest
from turnpool.serve.engine import PoolEngine, ServeSettings
from turnpool.serve.journal import FileJournal, JournalError, SessionRecord
from turnpool.serve.sessions import Session, SessionTable

log = logging.getLogger(__name__)


@dataclass
class Resumed:
    """What a start on a state directory brought back."""

    #: sessions rebuilt, with and without an episode in progress
    sessions: int = 0
    episodes: int = 0
    #: turns replayed in all
    turns: int = 0
    #: session ids that could not be brought back, and why
    lost: dict[str, str] = field(default_factory=dict)
    #: seconds the resume took (reading the journal, resets and replay)
    seconds: float = 0.0


def env_identity(engine: PoolEngine, front: tuple[int, int] | None = None
                 ) -> dict[str, Any]:
    """What a journal's sessions were played on: a journal is resumed only on the same
    (``front``: front k of n, whose session ids only front k of n serves)."""
    settings = engine.settings
    out: dict[str, Any] = {"env": str(settings.env), "env_kwargs": dict(settings.env_kwargs)}
    if front is not None:
        out["front"] = f"{front[0]} of {front[1]}"
    return out


def kept_snapshot_key(settings: ServeSettings, state_dir: Path) -> ServeSettings:
    """``settings`` signing snapshots with the key kept in ``state_dir/snapshot.key``: the
    first start writes its key there (owner-only), later starts read it, so snapshots a
    client took before a restart still restore after it. Delete the file to change keys."""
    path = state_dir / "snapshot.key"
    try:
        if path.exists():
            return dataclasses.replace(settings, snapshot_key=path.read_text().strip())
        state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(settings.snapshot_key + "\n")
    except OSError as exc:
        raise JournalError(f"cannot keep the snapshot key in {state_dir}: {exc}") from exc
    return settings


def open_journal(table: SessionTable, engine: PoolEngine, state_dir: Path,
                 fsync: str = "batch", front: tuple[int, int] | None = None
                 ) -> tuple[FileJournal, Resumed]:
    """Open the journal in ``state_dir``, resume the sessions it holds into ``table`` and
    record from now on; the journal (the caller closes it) and what was resumed."""
    def episode_of(session_id: str) -> str | None:
        session = table.get(session_id)
        return session.episode_id if session is not None else None

    began = time.perf_counter()
    journal = FileJournal(state_dir, env_identity(engine, front), fsync, episode_of)
    try:
        report = resume(table, engine, journal.sessions)
        report.seconds = time.perf_counter() - began
        for sid in report.lost:
            journal.closed(sid)
    except BaseException:
        journal.close()
        raise
    table.journal = journal
    return journal, report


def resume(table: SessionTable, engine: PoolEngine, records: dict[str, SessionRecord]
           ) -> Resumed:
    """Bring back every session of ``records`` into ``table`` (`Resumed` says how it went)."""
    report = Resumed()
    playing: list[tuple[Session, SessionRecord]] = []
    for sid, rec in records.items():
        try:
            session = table.resume(sid, rec.kind)
        except PoolFull:
            report.lost[sid] = f"no free slot (max_sessions {engine.capacity})"
            continue
        report.sessions += 1
        if rec.seed is not None:
            session.episode_id = rec.episode_id
            playing.append((session, rec))
    timeout = engine.settings.call_timeout_s()
    resets = [ResetSlotRequest(s.slot, rec.seed, concurrent.futures.Future())
              for s, rec in playing]
    results = _run(engine, resets, timeout)
    for (session, rec), out in zip(playing, results):
        if isinstance(out, BaseException) or out.error is not None:
            _lost(table, report, session, f"its reset to seed {rec.seed} failed: {out}")
        else:
            session.seed, session.started = rec.seed, True
    playing = [(s, rec) for s, rec in playing if s.started]
    turn = 0
    while playing:
        playing = [(s, rec) for s, rec in playing if len(rec.turns) > turn]
        steps = [StepSlotRequest(s.slot, list(rec.turns[turn]), concurrent.futures.Future())
                 for s, rec in playing]
        for (session, _), res in zip(playing, _run(engine, steps, timeout)):
            if isinstance(res, BaseException) or res.error is not None:
                _lost(table, report, session, f"its turn {turn + 1} failed on replay: {res}")
                continue
            report.turns += 1
            session.step_count += res.n_executed
            session.done = res.terminated or res.truncated
        playing = [(s, rec) for s, rec in playing if not s.closed]
        turn += 1
    report.episodes = sum(1 for s in table if s.started)
    if report.lost:
        log.warning("%d sessions could not be resumed: %s", len(report.lost),
                    "; ".join(f"{k}: {v}" for k, v in list(report.lost.items())[:5]))
    return report


def _lost(table: SessionTable, report: Resumed, session: Session, why: str) -> None:
    report.lost[session.id] = why
    report.sessions -= 1
    table.close(session)


def _run(engine: PoolEngine, requests: list[Any], timeout: float) -> list[Any]:
    """Submit ``requests`` as one engine submission and wait: each one's result, or the
    exception it got."""
    if not requests:
        return []
    engine.submit(*requests)
    concurrent.futures.wait([r.waiter for r in requests], timeout)
    out: list[Any] = []
    for r in requests:
        if not r.waiter.done():
            engine.abandon(r.slot)  # its env may still be running
        try:
            out.append(r.waiter.result(timeout=0))
        except Exception as exc:  # the failure is the answer (a timeout included)
            out.append(exc)
    return out


__all__ = ["Resumed", "env_identity", "kept_snapshot_key", "open_journal", "resume"]
