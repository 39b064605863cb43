"""Placement of new sessions among the fronts of one server, by measured cost.

Each front publishes, ten times a second, its load into a small shared file (`LoadBoard`):
the summed step cost of the slots its sessions hold that are measured
(`turnpool.pool.slots.SlotEngine.measured_load`), how many those are, its sessions, its free
slots and a publication count. `Placer` decides where a new ``/ws`` session goes with the
cost model the slot engine places leases by (`turnpool.pool.cost`): to the least loaded
front with a free slot, when this one carries more by over half a session's cost or has no
free slot.

Example:
    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> LoadBoard.create(d, count=2)
    >>> board = LoadBoard(d, index=0, count=2)
    >>> board.publish(cost=0.0, measured=0, leased=3, free=1)
    >>> board.row(0)[2:4]
    (3.0, 1.0)
    >>> board.close()
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from typing import Any

import turnpool.pool.cost as cost_model

#: Per front in the shared file: the summed step cost (s) of its measured sessions, how many
#: those are, its sessions, its free slots, its publication count.
_ROW = struct.Struct("<ddddd")
#: Sessions and free slots, `_COUNTS_AT` bytes into a row (rewritten alone when they change).
_COUNTS = struct.Struct("<dd")
_COUNTS_AT = 16
_SESSION_ID = re.compile(r"^f(\d{1,4})-")

Row = tuple[float, float, float, float, float]


def owner_of(session_id: Any) -> int | None:
    """The front a session id names (``f<k>-<hex>``; None: not a front's id)."""
    if not isinstance(session_id, str):
        return None
    m = _SESSION_ID.match(session_id)
    return int(m.group(1)) if m else None


class LoadBoard:
    """The shared file of a group's published loads, one `_ROW` per front, mapped."""

    def __init__(self, directory: str, index: int, count: int) -> None:
        self.index = index
        self.count = count
        self._file = open(self.path_in(directory), "r+b")  # noqa: SIM115 - held while serving
        self._map = mmap.mmap(self._file.fileno(), _ROW.size * count)
        self._published = 0.0

    @staticmethod
    def path_in(directory: str) -> str:
        return os.path.join(directory, "loads")

    @classmethod
    def create(cls, directory: str, count: int) -> None:
        with open(cls.path_in(directory), "wb") as f:
            f.write(bytes(_ROW.size * count))

    @classmethod
    def blank(cls, directory: str, k: int) -> None:
        """Blank front ``k``'s row (it died): the others place nothing there."""
        with open(cls.path_in(directory), "r+b") as f:
            f.seek(k * _ROW.size)
            f.write(bytes(_ROW.size))

    def row(self, k: int) -> Row:
        cost, measured, leased, free, seq = _ROW.unpack_from(self._map, k * _ROW.size)
        return cost, measured, leased, free, seq

    def rows(self) -> list[Row]:
        """One snapshot of every front's row."""
        return [self.row(k) for k in range(self.count)]

    def publish(self, cost: float, measured: int, leased: int, free: int) -> None:
        self._published += 1.0
        _ROW.pack_into(self._map, self.index * _ROW.size, cost, float(measured), float(leased),
                       float(free), self._published)

    def publish_counts(self, leased: int, free: int) -> None:
        """Rewrite this front's sessions and free slots alone (a session opened or closed)."""
        if not self._map.closed:  # sessions closed after the front stopped
            _COUNTS.pack_into(self._map, self.index * _ROW.size + _COUNTS_AT, float(leased),
                              float(free))

    def published(self) -> dict[str, float]:
        """This front's last publication (what other fronts place by)."""
        cost, measured, leased, free, seq = self.row(self.index)
        return {"measured_cost_s": cost, "measured": measured, "sessions": leased,
                "free": free, "publications": seq}

    def close(self) -> None:
        self._map.close()
        self._file.close()


def loads_of(rows: list[Row], index: int, leased: int, capacity: int
             ) -> tuple[list[float], list[float], float]:
    """Per front its load and free slots, and one session's mean cost, from ``rows``: a
    front's load is its measured sessions' cost plus its other sessions at the mean cost of
    every measured session (`turnpool.pool.cost.load_of`). Front ``index``'s sessions
    (``leased`` of ``capacity``) are taken live, the rest as published."""
    mean = cost_model.mean_of(sum(r[0] for r in rows), sum(r[1] for r in rows))
    loads, free = [], []
    for k, (c, m, held, f, _) in enumerate(rows):
        if k == index:
            held, f = float(leased), float(capacity - leased)
        loads.append(cost_model.load_of(c, held - m, mean))
        free.append(f)
    return loads, free, mean


class Placer:
    """Front ``index``'s placement decisions over the board's rows; remembers what it sent
    where since each front last published, so a burst is not all sent to one front."""

    def __init__(self, index: int, count: int) -> None:
        self.index = index
        self.count = count
        self._seen: list[tuple[float, float]] = [(-1.0, -1.0)] * count
        #: per front, the cost of the passes sent there since its row last changed
        self._sent = [0.0] * count

    def place(self, session_id: str | None, hops: int, rows: list[Row], leased: int,
              capacity: int) -> int | None:
        """The front a new ``/ws`` connection should go to (None: this one): a session's
        owner; else the least loaded front (what was sent there since it last published
        counted at the mean cost) when this one carries more by over half a session's cost,
        or has no free slot. A connection already passed ``hops`` times is passed on only
        while this front is full, and at most ``count`` times in all."""
        if session_id:
            owner = owner_of(session_id)
            return owner if owner is not None and owner != self.index and \
                owner < self.count and hops == 0 else None
        if hops >= self.count or (hops and leased < capacity):
            return None
        loads, free, mean = loads_of(rows, self.index, leased, capacity)
        full = free[self.index] < 1
        eligible, weighed = [], []
        for k, (_, _, held, _, seq) in enumerate(rows):
            if (seq, held) != self._seen[k]:  # it published, or opened or closed a
                self._seen[k], self._sent[k] = (seq, held), 0.0  # session: counted there
            pending = 0.0 if full else self._sent[k]  # full: any free slot beats refusing
            # not this one, started, and a free slot there
            eligible.append(k != self.index and seq > 0 and free[k] - pending / mean >= 1)
            weighed.append(loads[k] + pending)
        best = cost_model.least_loaded(weighed, eligible)
        if best is None or (not full and loads[self.index] - weighed[best] <= mean / 2):
            return None
        self._sent[best] += mean
        return best


__all__ = ["LoadBoard", "Placer", "loads_of", "owner_of"]
