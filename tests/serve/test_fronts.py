"""Several front processes on one port (``frontends=2``): real front processes sharing a
``SO_REUSEPORT`` port on 127.0.0.1, each with real worker processes. Sessions on either front
play exactly as on one front; a new session goes to the front whose sessions cost less (a
connection passed between processes); an HTTP session is served whichever front a request
lands on; a WebSocket attaching to an MCP session follows it to its front; ``/api/status`` and
``/metrics`` answer for every front; a dead front is restarted; nothing outlives the group."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import connect

from turnpool.serve import ServeSettings, TurnpoolServer
from turnpool.serve.fronts import ROUTED_HEADER, FrontGroup, owner_of

pytestmark = pytest.mark.timeout(240)

SETTINGS = ServeSettings(env="faulty", env_kwargs={"episode_len": 1000}, max_sessions=16,
                         backend="process", num_workers=2, step_timeout=10.0)


@pytest.fixture(scope="module")
def group() -> Iterator[FrontGroup]:
    with FrontGroup(ServeSettings(**{**SETTINGS.__dict__, "frontends": 2})) as g:
        yield g


def _ws(url: str, query: str = "") -> Any:
    return connect(url.replace("http://", "ws://") + "/ws" + query, open_timeout=60)


def _ask(ws: Any, kind: str, data: Any = None) -> dict[str, Any]:
    ws.send(json.dumps({"type": kind, "data": data or {}}))
    reply: dict[str, Any] = json.loads(ws.recv(timeout=60))
    return reply


def _until(what: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Poll ``what`` until it returns something true (bounded)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = what()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError("condition not reached in time")


def _status(url: str) -> dict[str, Any]:
    out: dict[str, Any] = httpx.get(url + "/api/status", timeout=30).json()
    return out


def _play(url: str, seeds: list[int]) -> list[tuple[str, list[Any]]]:
    """Each seed's session held open at once: its session id and its replies without ids."""
    socks = [_ws(url) for _ in seeds]
    try:
        out = []
        for ws, seed in zip(socks, seeds, strict=True):
            replies = [_ask(ws, "reset", {"seed": seed})]
            replies += [_ask(ws, "step", {"action": a}) for a in ("a", "b", "c")]
            sid = replies[0]["data"]["metadata"]["session_id"]
            for r in replies:
                for meta in (r["data"]["metadata"], r["data"]["observation"]["metadata"]):
                    meta.pop("session_id"), meta.pop("episode_id")
            out.append((sid, replies))
        return out
    finally:
        for ws in socks:
            ws.close()


def test_sessions_on_both_fronts_play_as_on_one(group: FrontGroup) -> None:
    seeds = list(range(10))
    got = _play(group.url, seeds)
    fronts = {owner_of(sid) for sid, _ in got}
    assert fronts <= {0, 1}
    with TurnpoolServer(SETTINGS) as one:
        want = _play(one.url, seeds)
    assert [r for _, r in got] == [r for _, r in want]
    status = _status(group.url)
    assert [f["up"] for f in status["frontends"]] == [True, True]
    assert status["capacity"] == 16 and len(status["workers"]) == 2
    assert {w["front"] for w in status["workers"]} == {0, 1}
    assert status["steps_total"] >= 30


def test_a_new_session_goes_to_the_front_whose_sessions_cost_less(group: FrontGroup) -> None:
    heavy = _ws(group.url)
    cheap: list[Any] = []
    try:
        first = _ask(heavy, "reset", {"seed": 1})["data"]["metadata"]["session_id"]
        for _ in range(4):
            assert _ask(heavy, "step", {"action": "busy:40"})["type"] == "observation"
        loaded = owner_of(first)
        other = 1 - loaded

        def published(k: int, sessions: int) -> dict[str, Any] | None:
            row = _status(group.url)["frontends"][k]["placement"]
            return row if row["measured"] == row["sessions"] == sessions else None

        assert _until(lambda: published(loaded, 1))["measured_cost_s"] > 0.01
        before = _status(group.url)
        for n in range(1, 7):
            ws = _ws(group.url)
            cheap.append(ws)
            reply = _ask(ws, "reset", {"seed": 100 + n})
            assert _ask(ws, "step", {"action": "a"})["type"] == "observation"
            # every new session went to the front without the expensive one, though the
            # kernel hands about half the connections to the other
            assert owner_of(reply["data"]["metadata"]["session_id"]) == other
            _until(lambda n=n: published(other, n))  # type: ignore[misc]
        after = _status(group.url)
        moved = sum(f["passed_out"] for f in after["frontends"]) - \
            sum(f["passed_out"] for f in before["frontends"])
        assert moved == sum(f["passed_in"] for f in after["frontends"]) - \
            sum(f["passed_in"] for f in before["frontends"])
        assert 0 <= moved <= 6  # only the connections the kernel gave the loaded front
    finally:
        for ws in [heavy, *cheap]:
            ws.close()


def test_a_burst_at_full_capacity_is_served_in_full(group: FrontGroup) -> None:
    """16 sessions opened at once on 16 slots (8 per front): whichever front the kernel
    hands each to, every one gets a slot, as on one front; three times over."""
    async def burst() -> list[str]:
        from turnpool.bench.ws_client import WsClient

        async def one(i: int) -> tuple[Any, str]:
            ws = await WsClient.connect(group.url)
            return ws, await asyncio.wait_for(ws.ask(json.dumps(
                {"type": "reset", "data": {"seed": i}})), 60)

        opened = await asyncio.gather(*(one(i) for i in range(16)))
        for ws, _ in opened:
            await ws.close()
        return [reply for _, reply in opened]

    for _ in range(3):
        _until(lambda: _status(group.url)["active_sessions"] == 0)
        replies = asyncio.run(burst())
        assert all(r.startswith('{"type":"observation"') for r in replies), replies


def test_an_http_session_is_served_by_either_front(group: FrontGroup) -> None:
    opened = httpx.post(group.url + "/reset", json={"seed": 7, "stateful": True},
                        timeout=30).json()
    sid = opened["metadata"]["session_id"]
    assert owner_of(sid) in (0, 1)
    routed = 0
    for k in range(16):  # a new connection each time: the kernel picks the front
        r = httpx.post(group.url + "/step", json={"session_id": sid, "action": {"action": "a"}},
                       timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["metadata"]["step_count"] == k + 1
        routed += ROUTED_HEADER in r.headers
    state = httpx.get(group.url + "/state", params={"session_id": sid}, timeout=30).json()
    assert state["step_count"] == 16 and state["session_id"] == sid
    assert 0 < routed < 16  # P(the kernel sends all 16 to one front) = 2**-15
    closed = httpx.post(group.url + "/close", json={"session_id": sid}, timeout=30)
    assert closed.status_code == 200
    gone = httpx.post(group.url + "/step", json={"session_id": sid, "action": {"action": "a"}},
                      timeout=30)
    assert gone.status_code == 404


def test_a_websocket_follows_an_mcp_session_to_its_front(group: FrontGroup) -> None:
    for _ in range(6):
        created = httpx.post(group.url + "/mcp", json={
            "jsonrpc": "2.0", "id": 1, "method": "openenv/session/create", "params": {}},
            timeout=30).json()
        sid = created["result"]["session_id"]
        with _ws(group.url, f"?session_id={sid}") as ws:
            reset = _ask(ws, "reset", {"seed": 3})
            assert reset["type"] == "observation", reset
            assert reset["data"]["metadata"]["session_id"] == sid
        closed = httpx.post(group.url + "/mcp", json={
            "jsonrpc": "2.0", "id": 2, "method": "openenv/session/close",
            "params": {"session_id": sid}}, timeout=30).json()
        assert closed["result"]["closed"] is True
    assert _status(group.url)["active_sessions"] == 0


def test_metrics_answer_for_every_front(group: FrontGroup) -> None:
    text = httpx.get(group.url + "/metrics", timeout=30).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    steps = families["turnpool_steps"].samples
    assert {s.labels["front"] for s in steps} == {"0", "1"}
    local = httpx.get(group.url + "/metrics", params={"local": "1"}, timeout=30).text
    assert 'front="' not in local
    status = _status(group.url)
    assert sum(s.value for s in steps if s.name.endswith("_total")) >= status["steps_total"]


def _descendants(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.NoSuchProcess):
        return psutil.Process(pid).children(recursive=True)
    return []


def _tree(group: FrontGroup) -> list[psutil.Process]:
    """The group's fronts and their workers."""
    out = []
    for pid in group.pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            out += [psutil.Process(pid), *_descendants(pid)]
    return out


def _gone(procs: list[psutil.Process]) -> bool:
    return not [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_a_dead_front_is_restarted_and_stop_leaves_nothing() -> None:
    group = FrontGroup(ServeSettings(**{**SETTINGS.__dict__, "frontends": 2,
                                        "max_sessions": 4}))
    try:
        procs = _tree(group)
        assert len(procs) >= 4  # 2 fronts, each with its workers
        first = group.pids
        os.kill(first[0], signal.SIGKILL)
        _until(lambda: group.pids[0] != first[0] and group.alive(), timeout=120)
        assert group.restarts == 1
        got = _play(group.url, [5, 6, 7, 8])
        assert all(r[-1]["type"] == "observation" for _, r in got)
        procs += _tree(group)
    finally:
        group.stop()
    group.stop()  # idempotent
    assert not os.path.exists(group.directory)
    _until(lambda: _gone(procs))


def test_the_fronts_and_their_workers_end_with_a_killed_supervisor() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "turnpool.cli", "serve", "--env", "faulty",
                             "--frontends", "2", "--num-workers", "2", "--max-sessions", "4",
                             "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        url = line.split(" at ", 1)[1].split()[0]
        assert _status(url)["capacity"] == 4
        kids = _descendants(proc.pid)
        assert len(kids) >= 4  # 2 fronts, each with its workers
        proc.kill()
        proc.wait(30)
        _until(lambda: _gone(kids), timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
