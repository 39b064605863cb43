"""The session journal of ``turnpool serve --state-dir``: a write-ahead log of every session's
seed and actions, from which a restarted server rebuilds its sessions
(`turnpool.serve.resume`).

One file, ``sessions.wal`` in the state directory, append-only, one record a line (compact
JSON arrays, so a line break never occurs inside one)::

    ["turnpool-sessions", 1, {"env": ..., "env_kwargs": {...}}]   the header
    ["o", id, kind]                    a session opened (kind: ws / http / mcp)
    ["r", id, seed, episode_id]        it reset to episode ``seed``
    ["s", id, [action, ...]]           it took one turn
    ["b", id, seed, episode_id, turns] it now plays episode ``seed`` after ``turns`` (a fork,
                                       a restore, and each live session in a compacted file)
    ["c", id]                          it closed

A record is written after the pool answered and before the client's reply is sent, with one
``write`` (so a killed server loses no answered step: the OS has it). ``fsync`` chooses how
far it is on disk: ``always`` (fdatasync before the reply: survives a machine crash; a disk
flush per step), ``batch`` (the default: a background thread fdatasyncs every
`BATCH_INTERVAL` s, so a machine crash loses at most that much; a killed server loses
nothing) and ``never`` (the OS writes back in its own time). A last record torn by a crash is
ignored; anything else unreadable is a `JournalError`. The file is compacted when opened
(rewritten with one ``o`` + ``b`` record per live session, closed ones dropped) and again
whenever it grows past `COMPACT_MIN_BYTES` and four times its live records.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> d = Path(tempfile.mkdtemp())
    >>> j = FileJournal(d, {"env": "bandit"}, fsync="never")
    >>> j.opened("s1", "ws"); j.reset("s1", 7); j.step("s1", ["dragon"]); j.close()
    >>> again = FileJournal(d, {"env": "bandit"}, fsync="never")
    >>> again.sessions["s1"]
    SessionRecord(kind='ws', seed=7, episode_id=None, turns=[('dragon',)])
    >>> again.close()
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from turnpool.serve.errors import ProtocolError
from turnpool.serve.jsonio import dumps_bytes, loads

log = logging.getLogger(__name__)

FILE_NAME = "sessions.wal"
MAGIC = "turnpool-sessions"
VERSION = 1
#: the fsync policies, safest first (see the module docstring)
FSYNC_POLICIES = ("always", "batch", "never")
#: seconds between two fdatasyncs of the ``batch`` policy
BATCH_INTERVAL = 0.1
#: the file is compacted while running once it is this big and 4x its live records
COMPACT_MIN_BYTES = 64 * 2**20


class Journal(Protocol):
    """What the session table and the service tell the journal (the server's one writer)."""

    def opened(self, session_id: str, kind: str) -> None: ...

    def reset(self, session_id: str, seed: int | None) -> None: ...

    def step(self, session_id: str, actions: Sequence[Any]) -> None: ...

    def branched(self, session_id: str, seed: int, turns: Sequence[Sequence[Any]]) -> None: ...

    def closed(self, session_id: str) -> None: ...


class NullJournal:
    """The default: records nothing (a server without ``--state-dir``)."""

    def opened(self, session_id: str, kind: str) -> None:
        return None

    def reset(self, session_id: str, seed: int | None) -> None:
        return None

    def step(self, session_id: str, actions: Sequence[Any]) -> None:
        return None

    def branched(self, session_id: str, seed: int, turns: Sequence[Sequence[Any]]) -> None:
        return None

    def closed(self, session_id: str) -> None:
        return None


class JournalError(RuntimeError):
    """The journal cannot be read (not one, another env's, or broken before its end)."""


@dataclass
class SessionRecord:
    """What the journal knows of one live session: its kind and, once it reset, its episode
    (seed, client's episode id) and the turns since."""

    kind: str
    seed: int | None = None
    episode_id: str | None = None
    turns: list[tuple[Any, ...]] = field(default_factory=list)


def read(path: Path, env: dict[str, Any]) -> dict[str, SessionRecord]:
    """The live sessions recorded in the journal at ``path`` (none if there is no file);
    ``env``: the server's env, which must be the journal's."""
    if not path.exists():
        return {}
    lines = path.read_bytes().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    elif lines:
        lines.pop()  # a last record the crash cut short: never answered, ignored
    live: dict[str, SessionRecord] = {}
    for n, line in enumerate(lines):
        try:
            rec = _loads(line)
            if n == 0:
                _check_header(rec, env, path)
            else:
                apply(live, rec)
        except (ValueError, TypeError, IndexError, KeyError) as exc:
            if n == len(lines) - 1 and n > 0:
                log.warning("%s: ignored a torn last record", path)
                break
            raise JournalError(f"{path}: record {n + 1} is unreadable ({exc}); the state "
                               "directory is not a turnpool session journal, or it is "
                               "damaged") from None
    return live


def _loads(line: bytes) -> Any:
    return (loads or json.loads)(line.decode())


def _check_header(rec: Any, env: dict[str, Any], path: Path) -> None:
    if not (isinstance(rec, list) and len(rec) == 3 and rec[0] == MAGIC):
        raise ValueError("no journal header")
    if rec[1] != VERSION:
        raise JournalError(f"{path}: journal version {rec[1]}; this turnpool reads {VERSION}")
    if rec[2] != env:
        raise JournalError(f"{path} holds sessions of {rec[2]}; this server runs {env}: "
                           "use another --state-dir (or the same env)")


def apply(live: dict[str, SessionRecord], rec: list[Any]) -> None:
    """Apply one journal record to ``live`` (session id -> record); ValueError if it is not
    one. Records of sessions never opened (one-call sessions) change nothing."""
    op, sid = rec[0], rec[1]
    if not isinstance(sid, str):
        raise ValueError(f"session id {sid!r}")
    if op == "o":
        live[sid] = SessionRecord(str(rec[2]))
        return
    if op == "c":
        live.pop(sid, None)
        return
    entry = live.get(sid)
    if op == "s":
        if not isinstance(rec[2], list):
            raise ValueError("actions must be a list")
        if entry is not None:
            entry.turns.append(tuple(rec[2]))
    elif op in ("r", "b"):
        seed, episode_id = rec[2], rec[3]
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed {seed!r}")
        turns = [tuple(t) for t in rec[4]] if op == "b" else []
        if entry is not None:
            entry.seed, entry.episode_id, entry.turns = seed, episode_id, turns
    else:
        raise ValueError(f"unknown record {op!r}")


def records_of(sid: str, entry: SessionRecord) -> list[list[Any]]:
    """The records that rebuild ``entry`` (a compacted file's lines for it)."""
    out: list[list[Any]] = [["o", sid, entry.kind]]
    if entry.seed is not None:
        out.append(["b", sid, entry.seed, entry.episode_id, [list(t) for t in entry.turns]])
    return out


class FileJournal:
    """The journal in ``state_dir`` (`Journal`): opening it reads what it holds
    (`sessions`), compacts it and appends from then on; ``episode_of(session_id)`` names a
    session's episode id for its reset records. Calls come from one thread (the event
    loop); `close` is idempotent."""

    def __init__(self, state_dir: Path, env: dict[str, Any], fsync: str = "batch",
                 episode_of: Callable[[str], str | None] | None = None) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync must be one of {', '.join(FSYNC_POLICIES)}, got {fsync!r}")
        self.path = Path(state_dir) / FILE_NAME
        self.env = _loads(dumps_bytes(env))  # as the header reads back
        self.fsync = fsync
        self.episode_of = episode_of or (lambda sid: None)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            #: the live sessions, kept so that the file can be compacted
            self.sessions = read(self.path, self.env)
        except OSError as exc:
            raise JournalError(f"cannot use the state directory {state_dir}: {exc}") from exc
        #: bytes of the file that rebuild each live session, and their sum
        self._live_bytes: dict[str, int] = {}
        self._live_total = 0
        self._size = 0
        self._fd = -1
        self._lock = threading.Lock()  # the fd, between the writer and the fsync thread
        self._dirty = False
        self._keep_open = False
        self._closed = False
        #: size past which the next compaction is tried
        self._compact_at = COMPACT_MIN_BYTES
        self._stop = threading.Event()
        try:
            self.compact()
        except OSError as exc:
            raise JournalError(f"cannot write the journal {self.path}: {exc}") from exc
        self._syncer: threading.Thread | None = None
        if fsync == "batch":
            self._syncer = threading.Thread(target=self._sync_forever, daemon=True,
                                            name="turnpool-journal-sync")
            self._syncer.start()

    # ------------------------------------------------------------------ Journal
    def opened(self, session_id: str, kind: str) -> None:
        self.sessions[session_id] = SessionRecord(kind)
        self._forget(session_id)
        self._write(session_id, ["o", session_id, kind])

    def reset(self, session_id: str, seed: int | None) -> None:
        entry = self.sessions.get(session_id)
        if entry is None or seed is None:  # a one-call session, or no episode: nothing kept
            return
        entry.seed, entry.turns = seed, []
        entry.episode_id = self.episode_of(session_id)
        self._forget(session_id)
        self._write(session_id, ["r", session_id, seed, entry.episode_id])

    def step(self, session_id: str, actions: Sequence[Any]) -> None:
        entry = self.sessions.get(session_id)
        if entry is None:
            return
        entry.turns.append(tuple(actions))
        self._write(session_id, ["s", session_id, list(actions)])

    def branched(self, session_id: str, seed: int, turns: Sequence[Sequence[Any]]) -> None:
        entry = self.sessions.get(session_id)
        if entry is None:
            return
        entry.seed, entry.turns = seed, [tuple(t) for t in turns]
        entry.episode_id = self.episode_of(session_id)
        self._forget(session_id)
        self._write(session_id, records_of(session_id, entry)[-1])

    def closed(self, session_id: str) -> None:
        if self._keep_open or self.sessions.pop(session_id, None) is None:
            return
        self._forget(session_id)
        try:
            self._write(None, ["c", session_id])
        except ProtocolError:  # logged; the session is resumed, then closed when idle
            pass

    def _forget(self, session_id: str) -> None:
        """The records written so far for ``session_id`` rebuild nothing any more."""
        self._live_total -= self._live_bytes.pop(session_id, 0)

    # ------------------------------------------------------------------ the file
    def _write(self, session_id: str | None, rec: list[Any]) -> None:
        if self._closed:
            return
        line = dumps_bytes(rec) + b"\n"
        try:
            os.write(self._fd, line)  # O_APPEND: one record, one write
            if self.fsync == "always":
                os.fdatasync(self._fd)
        except OSError as exc:
            log.error("the session journal %s cannot be written: %s", self.path, exc)
            raise ProtocolError("EXECUTION_ERROR", f"the session journal cannot be written "
                                f"({exc.strerror}): this answer would not survive a "
                                "restart", status=507) from exc
        self._dirty = True
        self._size += len(line)
        if session_id is not None:
            self._live_bytes[session_id] = self._live_bytes.get(session_id, 0) + len(line)
            self._live_total += len(line)
        if self._size > self._compact_at and self._size > 4 * self._live_total:
            try:
                self.compact()
            except OSError as exc:  # the log only grows meanwhile; tried again at twice this
                log.error("the session journal %s cannot be compacted: %s", self.path, exc)
                self._compact_at = 2 * self._size

    def compact(self) -> None:
        """Rewrite the file with only the live sessions (atomic: a crash leaves the old or
        the new file whole) and append to the new one."""
        tmp = self.path.with_suffix(".tmp")
        lines = [dumps_bytes([MAGIC, VERSION, self.env]) + b"\n"]
        live: dict[str, int] = {}
        for sid, entry in self.sessions.items():
            recs = [dumps_bytes(r) + b"\n" for r in records_of(sid, entry)]
            live[sid] = sum(map(len, recs))
            lines += recs
        data = b"".join(lines)
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        with self._lock:
            os.replace(tmp, self.path)
            _fsync_dir(self.path.parent)
            old, self._fd = self._fd, os.open(self.path, os.O_WRONLY | os.O_APPEND)
            if old >= 0:
                os.close(old)
            self._size = len(data)
            self._dirty = False
        self._live_bytes, self._live_total = live, sum(live.values())
        self._compact_at = COMPACT_MIN_BYTES

    def _sync_forever(self) -> None:
        while not self._stop.wait(BATCH_INTERVAL):
            self.sync()

    def sync(self) -> None:
        """fdatasync what was written (if anything)."""
        with self._lock:
            if self._dirty and self._fd >= 0:
                self._dirty = False
                with contextlib.suppress(OSError):
                    os.fdatasync(self._fd)

    def keep_sessions(self) -> None:
        """Record no more closes (a server shutting down: the sessions its shutdown ends
        stay in the journal, to be resumed by the next start), and sync."""
        self._keep_open = True
        self.sync()

    def close(self) -> None:
        self.keep_sessions()
        self._closed = True
        self._stop.set()
        if self._syncer is not None:
            self._syncer.join(5.0)
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["BATCH_INTERVAL", "COMPACT_MIN_BYTES", "FILE_NAME", "FSYNC_POLICIES",
           "FileJournal", "Journal", "JournalError", "NullJournal", "SessionRecord", "apply",
           "read", "records_of"]
