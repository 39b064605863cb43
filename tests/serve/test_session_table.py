"""Unit tests of the serve side's state machines with fakes (no server, no processes): the
session table (every session change and its one timer) and the placement of new sessions
among fronts (the cost model the slot engine shares)."""

from __future__ import annotations

import asyncio
import gc
import tempfile
import weakref
from typing import Any

import pytest

from turnpool.pool.slots import PoolFull, PoolTimeout
from turnpool.serve.engine import ServeSettings
from turnpool.serve.errors import ProtocolError
from turnpool.serve.fronts.placement import LoadBoard, Placer, Row, owner_of
from turnpool.serve.running import SERVING_GC_THRESHOLD, collector_for_serving
from turnpool.serve.sessions import SessionTable


class FakeSlots:
    """Slots leased in order; records releases and abandons."""

    def __init__(self, capacity: int = 4) -> None:
        self.capacity = capacity
        self.free = list(range(capacity))
        self.released: list[int] = []
        self.abandoned: list[int] = []

    def lease(self, near: int | None = None) -> int:
        if not self.free:
            raise PoolFull("full")
        return self.free.pop(0)

    def release(self, slot: int) -> None:
        self.released.append(slot)
        self.free.append(slot)

    def abandon(self, slot: int) -> None:
        self.abandoned.append(slot)


class FakePeer:
    def __init__(self) -> None:
        self.sent: list[str] = []
        self.ended: list[int] = []

    def send(self, text: str) -> None:
        self.sent.append(text)

    def end(self, code: int = 1000) -> None:
        self.ended.append(code)


def _table(slots: FakeSlots | None = None, changes: list[int] | None = None,
           **settings: Any) -> SessionTable:
    """A table over ``slots``; each change appends the table's size to ``changes``."""
    seen = changes if changes is not None else []
    table = SessionTable(slots or FakeSlots(), ServeSettings(**settings), id_prefix="f1-",
                         on_change=lambda: seen.append(len(table)))
    return table


def test_opening_and_closing_a_session_leases_and_releases_its_slot_once() -> None:
    slots, changes = FakeSlots(), list[int]()
    table = _table(slots, changes)
    session = table.open("ws")
    assert session.id.startswith("f1-") and owner_of(session.id) == 1
    assert table.get(session.id) is session and len(table) == 1
    table.close(session)
    table.close(session)  # idempotent
    assert slots.released == [session.slot] and table.get(session.id) is None
    assert changes == [1, 0]


def test_held_sessions_are_capped_and_a_full_engine_refuses_at_once() -> None:
    table = _table(FakeSlots(capacity=3), max_sessions=3, max_http_sessions=1)
    table.open("http")
    with pytest.raises(ProtocolError, match="max_http_sessions") as capped:
        table.open("mcp")
    assert capped.value.code == "CAPACITY_REACHED" and capped.value.status == 503
    table.open("ws")
    table.open("once")
    with pytest.raises(ProtocolError, match="all 3 env slots") as full:
        table.open("ws")
    assert full.value.code == "CAPACITY_REACHED"
    assert table.refused == 2


def test_a_session_takes_one_websocket_at_a_time() -> None:
    table = _table()
    session = table.open("mcp")
    first, second = FakePeer(), FakePeer()
    assert table.attach(session.id, first) is session
    with pytest.raises(ProtocolError, match="already has an attached WebSocket"):
        table.attach(session.id, second)
    table.detach(session, second)  # not its peer: nothing changes
    assert session.websocket is first
    table.detach(session, first)
    assert table.attach(session.id, second).websocket is second
    with pytest.raises(ProtocolError, match="Unknown session_id"):
        table.attach("f1-nope", first)


def test_a_held_session_idle_past_its_limit_is_closed_by_the_sweep() -> None:
    slots = FakeSlots()
    table = _table(slots, http_session_timeout=5.0)
    held = table.open("http")
    ws = table.open("ws")
    assert table.sweep(now=held.last_active + 4.0) == []
    assert table.sweep(now=held.last_active + 6.0) == [held]
    assert slots.released == [held.slot] and table.reaped == 1
    # a WebSocket's session lives with its connection (no session_timeout set)
    assert table.sweep(now=ws.last_active + 10_000.0) == []


def test_an_idle_websocket_session_is_closed_and_told_when_session_timeout_is_set() -> None:
    table = _table(session_timeout=2.0)
    peer = FakePeer()
    session = table.open("ws", peer)
    assert session.websocket is peer
    assert table.sweep(now=session.last_active + 3.0) == [session]
    assert '"code":"SESSION_ERROR"' in peer.sent[0] and "2 s idle" in peer.sent[0]
    assert peer.ended == [1000]


def test_a_call_past_its_deadline_fails_with_pool_timeout_and_abandons_its_slot() -> None:
    slots = FakeSlots()
    table = _table(slots, call_timeout=3.0, http_session_timeout=1.0)
    session = table.open("http")
    loop = asyncio.new_event_loop()
    try:
        fut = loop.create_future()
        table.begin_call(session, fut)
        assert session.busy
        table.sweep(now=session.deadline - 0.1)
        assert not fut.done()
        table.sweep(now=session.deadline + 0.1)  # also past the idle limit: busy, kept
        assert isinstance(fut.exception(), PoolTimeout)
        assert slots.abandoned == [session.slot] and table.get(session.id) is session
        table.end_call(session)
        assert not session.busy
    finally:
        loop.close()


def test_the_sweep_period_follows_the_shortest_limit() -> None:
    assert _table(session_timeout=None, http_session_timeout=300.0).period == 1.0
    assert _table(session_timeout=1.0).period == pytest.approx(0.25)
    assert _table(session_timeout=0.1).period == 0.2


# ---------------------------------------------------------------------- placement
def _rows(*fronts: tuple[float, float, float, float]) -> list[Row]:
    """Board rows (cost, measured, sessions, free), each published once."""
    return [(c, m, s, f, 1.0) for c, m, s, f in fronts]


def test_a_new_session_goes_to_a_front_that_carries_less_by_over_half_a_session() -> None:
    placer = Placer(index=0, count=2)
    # front 0: two sessions costing 0.2 s each; front 1: one session costing 0.2 s
    rows = _rows((0.4, 2, 2, 2), (0.2, 1, 1, 3))
    assert placer.place(None, 0, rows, leased=2, capacity=4) == 1  # 0.4 - 0.2 > 0.1
    # what was just sent there counts: front 1 now carries as much as this one
    assert placer.place(None, 0, rows, leased=2, capacity=4) is None
    even = _rows((0.2, 1, 1, 3), (0.2, 1, 1, 3))
    assert Placer(0, 2).place(None, 0, even, leased=1, capacity=4) is None


def test_a_full_front_passes_to_any_front_with_a_free_slot() -> None:
    rows = _rows((0.1, 2, 2, 0), (0.9, 1, 1, 1))
    assert Placer(0, 2).place(None, 0, rows, leased=2, capacity=2) == 1
    no_room = _rows((0.1, 2, 2, 0), (0.9, 1, 1, 0))
    assert Placer(0, 2).place(None, 0, no_room, leased=2, capacity=2) is None


def test_a_front_that_never_published_gets_nothing() -> None:
    rows = [(0.4, 2.0, 2.0, 2.0, 1.0), (0.0, 0.0, 0.0, 0.0, 0.0)]
    assert Placer(0, 2).place(None, 0, rows, leased=2, capacity=4) is None


def test_a_session_id_is_placed_on_its_owner_on_the_first_hop_only() -> None:
    rows = _rows((0.0, 0, 0, 4), (0.0, 0, 0, 4), (0.0, 0, 0, 4))
    placer = Placer(index=0, count=3)
    assert placer.place("f2-abc", 0, rows, leased=0, capacity=4) == 2
    assert placer.place("f2-abc", 1, rows, leased=0, capacity=4) is None
    assert placer.place("f0-abc", 0, rows, leased=0, capacity=4) is None  # ours
    assert placer.place("f7-abc", 0, rows, leased=0, capacity=4) is None  # no such front


def test_a_passed_connection_moves_on_only_while_this_front_is_full() -> None:
    rows = _rows((0.0, 0, 3, 1), (0.0, 0, 0, 4))
    placer = Placer(index=0, count=2)
    assert placer.place(None, 1, rows, leased=3, capacity=4) is None
    full = _rows((0.0, 0, 4, 0), (0.0, 0, 0, 4))
    assert placer.place(None, 1, full, leased=4, capacity=4) == 1
    assert placer.place(None, 2, full, leased=4, capacity=4) is None  # passed count times


def test_the_board_keeps_each_fronts_row_and_blanks_a_dead_one() -> None:
    directory = tempfile.mkdtemp()
    LoadBoard.create(directory, count=2)
    mine, theirs = LoadBoard(directory, 0, 2), LoadBoard(directory, 1, 2)
    try:
        theirs.publish(cost=0.3, measured=2, leased=3, free=1)
        theirs.publish_counts(leased=4, free=0)
        assert mine.row(1) == (0.3, 2.0, 4.0, 0.0, 1.0)
        LoadBoard.blank(directory, 1)
        assert mine.rows()[1] == (0.0, 0.0, 0.0, 0.0, 0.0)
    finally:
        mine.close()
        theirs.close()


class _Box:
    """A weakly referenceable holder, put in a reference cycle."""

    def __init__(self, inner: list[Any]) -> None:
        self.inner = inner
        inner.append(self)


def test_a_foreground_server_sets_the_collector_and_puts_it_back() -> None:
    before = gc.get_threshold()
    built = [object() for _ in range(3)]  # alive before: frozen while serving
    with collector_for_serving():
        assert gc.get_threshold() == (SERVING_GC_THRESHOLD, *before[1:])
        assert gc.get_freeze_count() > 0
        cycle: list[Any] = []
        cycle.append(cycle)  # cyclic garbage made while serving is still collected
        ref = weakref.ref(_Box(cycle))
        del cycle
        gc.collect()
        assert ref() is None
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
    assert built
