"""Branching through ``turnpool serve`` (real servers on 127.0.0.1, real worker processes):
``fork``, ``snapshot`` and ``restore`` as ``/ws`` messages, MCP tools and HTTP routes. A
fork's or a restored session's continuation equals the original's and an uninterrupted
in-process run's, byte for byte; bad snapshots are refused and leave the session as it was;
forks count against capacity; OpenEnv's stock client and ``openenv validate`` still pass
beside forks; the journal hears each branch; several fronts fork and restore too; and
``turnpool bench fork`` measures a served fork."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import json
import pickle
import random
import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from websockets.sync.client import connect

import turnpool
from tests.serve.conftest import client, openenv_validate
from turnpool.cli import main
from turnpool.pool.branch import Snapshot
from turnpool.pool.slot_requests import ForkSlotRequest, SnapshotSlotRequest, StepSlotRequest
from turnpool.pool.slots import SlotEngine
from turnpool.serve import ServeSettings, TurnpoolServer
from turnpool.serve.engine import PoolEngine
from turnpool.serve.fronts import FrontGroup, owner_of
from turnpool.serve.service import Service
from turnpool.serve.snapshots import SnapshotCodec

pytestmark = pytest.mark.timeout(240)

ENVS = {"sokoban": ["Up", "Down", "Left", "Right"],
        "frozen_lake": ["Left", "Down", "Right", "Up"]}


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, TurnpoolServer]]:
    out: dict[str, TurnpoolServer] = {}
    try:
        for env in ENVS:
            out[env] = TurnpoolServer(ServeSettings(
                env=env, max_sessions=5, max_http_sessions=3, backend="process",
                num_workers=2))
        yield out
    finally:
        for srv in out.values():
            srv.stop()


def _ws(url: str, session_id: str | None = None) -> Any:
    query = f"?session_id={session_id}" if session_id else ""
    return connect(url.replace("http://", "ws://") + "/ws" + query, open_timeout=60)


def _ask(ws: Any, kind: str, data: Any = None) -> dict[str, Any]:
    ws.send(json.dumps({"type": kind} if data is None else {"type": kind, "data": data}))
    reply: dict[str, Any] = json.loads(ws.recv(timeout=60))
    return reply


def _turn(reply: dict[str, Any]) -> tuple[Any, ...]:
    """What a step's reply says of the env (not of the session): text, flags, info, reward."""
    assert reply["type"] == "observation", reply
    obs = reply["data"]["observation"]
    return (obs["text"], obs["terminated"], obs["truncated"], json.dumps(obs["info"]),
            reply["data"]["reward"], reply["data"]["done"])


def _reference(env: str, seed: int, actions: Sequence[str]) -> list[tuple[Any, ...]]:
    """Each step's `_turn` of an uninterrupted in-process run (stops at done; the pool's
    info also names the flags)."""
    e = turnpool.make(env)
    try:
        e.reset(seed=seed)
        out = []
        for a in actions:
            obs, reward, terminated, truncated, info = e.step(a)
            done = terminated or truncated
            info = {**info, "terminated": terminated, "truncated": truncated}
            out.append((obs, terminated, truncated, json.dumps(info), float(reward), done))
            if done:
                break
        return out
    finally:
        e.close()


def _episode(env: str, rng: random.Random) -> tuple[int, list[str], list[str]]:
    """A seed, a prefix of actions that leaves the episode running, and a continuation."""
    while True:
        seed = rng.randrange(10_000)
        prefix = [rng.choice(ENVS[env]) for _ in range(rng.randrange(1, 5))]
        rest = [rng.choice(ENVS[env]) for _ in range(6)]
        ref = _reference(env, seed, prefix)
        if len(ref) == len(prefix) and not ref[-1][-1]:
            return seed, prefix, rest


def _play(ws: Any, actions: Sequence[str]) -> list[tuple[Any, ...]]:
    out = []
    for a in actions:
        out.append(_turn(_ask(ws, "step", {"action": a})))
        if out[-1][-1]:
            break
    return out


def _close(url: str, session_id: str) -> None:
    assert httpx.post(url + "/close", json={"session_id": session_id},
                      timeout=30).json() == {"closed": True}


def _sessions(url: str, want: int) -> int:
    """How many sessions the server holds, once it is ``want`` (a closed WebSocket's session
    ends when the server reads the close; bounded)."""
    end = time.monotonic() + 30
    while True:
        n = len(httpx.get(url + "/api/status", timeout=30).json()["sessions"])
        if n == want or time.monotonic() > end:
            return n
        time.sleep(0.02)


@pytest.mark.parametrize("env", list(ENVS))
def test_a_fork_continues_exactly_as_its_source(servers: dict[str, TurnpoolServer],
                                               env: str) -> None:
    url = servers[env].url
    rng = random.Random(f"fork-{env}")
    for _ in range(3):
        seed, prefix, rest = _episode(env, rng)
        with _ws(url) as src:
            _ask(src, "reset", {"seed": seed})
            _play(src, prefix)
            fork = _ask(src, "fork")
            assert fork["type"] == "fork", fork
            fid = fork["data"]["session_id"]
            assert fork["data"]["metadata"]["session_id"] == fid
            assert fork["data"]["metadata"]["seed"] == seed
            assert fork["data"]["metadata"]["step_count"] == len(prefix)
            assert fork["data"]["done"] is False and fork["data"]["reward"] is None
            with _ws(url, fid) as dst:  # a client reaches the fork by its id
                theirs = _play(dst, rest)
            ours = _play(src, rest)
            want = _reference(env, seed, prefix + rest)[len(prefix):]
            assert theirs == ours == want
            # over HTTP too: the fork is a held session, alive after its WebSocket left
            state = httpx.get(url + "/state", params={"session_id": fid}, timeout=30).json()
            assert state["step_count"] == len(prefix) + len(theirs)
            _close(url, fid)


@pytest.mark.parametrize("env", list(ENVS))
def test_a_restore_continues_exactly_as_the_snapshot_would(
        servers: dict[str, TurnpoolServer], env: str) -> None:
    url = servers[env].url
    seed, prefix, rest = _episode(env, random.Random(f"restore-{env}"))
    want = _reference(env, seed, prefix + rest)[len(prefix):]
    with _ws(url) as ws, _ws(url) as other:
        _ask(ws, "reset", {"seed": seed})
        _play(ws, prefix)
        reply = _ask(ws, "snapshot")
        assert reply["type"] == "snapshot", reply
        snap = reply["data"]["snapshot"]
        json.dumps(snap)  # a JSON value, no server-side handle
        assert snap["seed"] == seed and snap["turns"] == [[a] for a in prefix]
        assert _play(ws, rest) == want
        for target in (ws, other):  # the session itself, later; a session with no episode
            back = _ask(target, "restore", {"snapshot": snap})
            assert back["type"] == "observation", back
            assert back["data"]["metadata"]["step_count"] == len(prefix)
            assert back["data"]["metadata"]["seed"] == seed
            assert _play(target, rest) == want


def test_bad_input_is_a_clear_error_and_leaves_the_session_as_it_was(
        servers: dict[str, TurnpoolServer]) -> None:
    url = servers["sokoban"].url
    with _ws(url) as ws, _ws(servers["frozen_lake"].url) as lake:
        assert _ask(ws, "fork")["data"]["code"] == "VALIDATION_ERROR"  # no episode yet
        assert _ask(ws, "snapshot")["data"]["code"] == "VALIDATION_ERROR"
        _ask(ws, "reset", {"seed": 7})
        _ask(ws, "step", {"action": "Up"})
        snap = _ask(ws, "snapshot")["data"]["snapshot"]
        _ask(lake, "reset", {"seed": 7})
        _ask(lake, "step", {"action": "Up"})  # still playing (Down reaches the goal)
        lake_snap = _ask(lake, "snapshot")["data"]["snapshot"]
        foreign = SnapshotCodec("sokoban", "another key", 16_384, 64).encode(
            Snapshot(snap["env_key"], 7, (("Up",),)))
        pickled = base64.b64encode(pickle.dumps(Snapshot(snap["env_key"], 7, ()))).decode()
        bad: list[Any] = [
            {**snap, "seed": 8}, {**snap, "turns": [["Up"], ["Up"]]},
            {**snap, "turns": [["x" * 20_000]]}, {**snap, "turns": [[True]]},
            {**snap, "turns": [[]]}, {**snap, "mac": "00"}, {**snap, "extra": 1},
            {**snap, "format": "other/1"}, lake_snap, foreign, pickled, "", None, [], {},
            {**snap, "seed": -1}, {**snap, "turns": [["Up"]] * 100_001}]
        for value in bad:
            reply = _ask(ws, "restore", {"snapshot": value})
            assert reply["type"] == "error", value
            assert reply["data"]["code"] in ("VALIDATION_ERROR", "INVALID_JSON"), reply
        assert "plays sokoban; the snapshot is of frozen_lake" in \
            _ask(ws, "restore", {"snapshot": lake_snap})["data"]["message"]
        for data in (None, [], {}, {"snap": snap}, {"snapshot": snap, "more": 1}):
            assert _ask(ws, "restore", data)["data"]["code"] == "VALIDATION_ERROR"
        # the session is where it was: its next step is the uninterrupted run's
        assert _ask(ws, "state")["data"]["step_count"] == 1
        assert [_turn(_ask(ws, "step", {"action": "Left"}))] == \
            _reference("sokoban", 7, ["Up", "Left"])[1:]
    assert _sessions(url, 0) == 0


def test_forks_count_against_capacity_like_any_session(
        servers: dict[str, TurnpoolServer]) -> None:
    url = servers["sokoban"].url
    with _ws(url) as ws:
        _ask(ws, "reset", {"seed": 3})
        forks = [_ask(ws, "fork")["data"]["session_id"] for _ in range(3)]  # the HTTP cap
        refused = _ask(ws, "fork")
        held = httpx.post(url + "/reset", json={"stateful": True}, timeout=30)
        assert refused["type"] == "error" and refused["data"]["code"] == "CAPACITY_REACHED"
        assert refused["data"] == held.json()["detail"]  # the error a new session gets
        with _ws(url) as fifth:  # one slot left: a WebSocket session takes it
            assert _ask(fifth, "reset", {"seed": 1})["type"] == "observation"
            with _ws(url) as sixth:  # the slots are used up
                assert json.loads(sixth.recv(timeout=60))["data"]["code"] == \
                    "CAPACITY_REACHED"
        _close(url, forks.pop())
        forks.append(_ask(ws, "fork")["data"]["session_id"])
        assert _sessions(url, 4) == 4
        for fid in forks:
            _close(url, fid)
    assert _sessions(url, 0) == 0


def test_mcp_tools_fork_snapshot_and_restore(servers: dict[str, TurnpoolServer]) -> None:
    url = servers["sokoban"].url

    def rpc(method: str, **params: Any) -> Any:
        reply = httpx.post(url + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": method,
                                               "params": params}, timeout=30).json()
        assert "error" not in reply, reply
        return reply["result"]

    names = {t["name"] for t in rpc("tools/list")["tools"]}
    assert {"fork", "snapshot", "restore", "reset", "act"} <= names
    sid = rpc("openenv/session/create")["session_id"]
    rpc("tools/call", name="reset", arguments={"seed": 11}, session_id=sid)
    rpc("tools/call", name="act", arguments={"action": "Down"}, session_id=sid)
    fork = rpc("tools/call", name="fork", arguments={}, session_id=sid)["structuredContent"]
    snap = rpc("tools/call", name="snapshot", arguments={},
               session_id=sid)["structuredContent"]["snapshot"]
    want = _reference("sokoban", 11, ["Down", "Right", "Up"])[1:]

    def act(session_id: str) -> list[tuple[Any, ...]]:
        out = []
        for a in ("Right", "Up"):
            data = rpc("tools/call", name="act", arguments={"action": a},
                       session_id=session_id)["structuredContent"]
            out.append(_turn({"type": "observation", "data": data}))
        return out

    assert act(fork["session_id"]) == act(sid) == want
    back = rpc("tools/call", name="restore", arguments={"snapshot": snap}, session_id=sid)
    assert back["structuredContent"]["metadata"]["step_count"] == 1
    assert act(sid) == want
    stateless = httpx.post(url + "/mcp", json={
        "jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "fork", "arguments": {}}}, timeout=30).json()
    assert stateless["error"]["data"]["code"] == "SESSION_ERROR"
    with _ws(url) as ws:  # the same tools as MCP frames on a WebSocket, for its session
        _ask(ws, "reset", {"seed": 11})
        _ask(ws, "step", {"action": "Down"})
        framed = _ask(ws, "mcp", {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                                  "params": {"name": "fork", "arguments": {}}})
        fid = framed["data"]["result"]["structuredContent"]["session_id"]
        assert act(fid) == want
    for s in (sid, fork["session_id"], fid):
        rpc("openenv/session/close", session_id=s)
    assert _sessions(url, 0) == 0


def test_http_routes_fork_snapshot_and_restore(servers: dict[str, TurnpoolServer]) -> None:
    url = servers["frozen_lake"].url
    seed, prefix, rest = _episode("frozen_lake", random.Random("http"))
    want = _reference("frozen_lake", seed, prefix + rest)[len(prefix):]
    with httpx.Client(base_url=url, timeout=30) as http:
        def play(sid: str) -> list[tuple[Any, ...]]:
            out = []
            for a in rest:
                out.append(_turn({"type": "observation", "data": http.post(
                    "/step", json={"session_id": sid, "action": {"action": a}}).json()}))
                if out[-1][-1]:
                    break
            return out

        sid = http.post("/reset", json={"seed": seed, "stateful": True}).json()[
            "metadata"]["session_id"]
        for a in prefix:
            http.post("/step", json={"session_id": sid, "action": {"action": a}})
        fork = http.post("/fork", json={"session_id": sid}).json()
        snap = http.post("/snapshot", json={"session_id": sid}).json()["snapshot"]
        assert play(fork["session_id"]) == play(sid) == want
        back = http.post("/restore", json={"session_id": sid, "snapshot": snap}).json()
        assert back["metadata"]["step_count"] == len(prefix)
        assert play(sid) == want
        fresh = http.post("/restore", json={"snapshot": snap}).json()  # a new held session
        assert play(fresh["metadata"]["session_id"]) == want
        refused = http.post("/restore", json={"snapshot": {**snap, "seed": seed + 1}})
        assert refused.status_code == 422
        assert refused.json()["detail"]["code"] == "VALIDATION_ERROR"
        gone = http.post("/fork", json={"session_id": "nope"})
        assert gone.status_code == 404 and gone.json()["detail"]["code"] == "SESSION_ERROR"
        for s in (sid, fork["session_id"], fresh["metadata"]["session_id"]):
            assert http.post("/close", json={"session_id": s}).json() == {"closed": True}
    assert _sessions(url, 0) == 0


def test_openenv_stock_client_passes_beside_forks(servers: dict[str, TurnpoolServer]
                                                  ) -> None:
    url = servers["sokoban"].url
    want = _reference("sokoban", 5, ["Up", "Left"])
    with _ws(url) as ws, client(url) as stock:
        _ask(ws, "reset", {"seed": 5})
        _ask(ws, "step", {"action": "Up"})
        fid = _ask(ws, "fork")["data"]["session_id"]
        first = stock.reset(seed=5)
        assert first.observation["text"] == turnpool.make("sokoban").reset(seed=5)[0]
        steps = [stock.step({"action": a}) for a in ("Up", "Left")]
        assert [(s.observation["text"], s.reward, s.done) for s in steps] == \
            [(w[0], w[4], w[5]) for w in want]
        with _ws(url, fid) as dst:
            assert _play(dst, ["Left"]) == want[1:]
        openenv_validate(url)
        _close(url, fid)


class Recorder:
    """A `Journal` that keeps what it heard."""

    def __init__(self) -> None:
        self.heard: list[tuple[Any, ...]] = []

    def opened(self, session_id: str, kind: str) -> None:
        self.heard.append(("opened", session_id, kind))

    def reset(self, session_id: str, seed: int | None) -> None:
        self.heard.append(("reset", session_id, seed))

    def step(self, session_id: str, actions: Sequence[Any]) -> None:
        self.heard.append(("step", session_id, tuple(actions)))

    def branched(self, session_id: str, seed: int, turns: Sequence[Sequence[Any]]) -> None:
        self.heard.append(("branched", session_id, seed, tuple(map(tuple, turns))))

    def closed(self, session_id: str) -> None:
        self.heard.append(("closed", session_id))


def test_the_journal_hears_each_fork_and_restore() -> None:
    async def run(service: Service, journal: Recorder) -> None:
        a = service.sessions.open("ws")
        await service.reset(a, {"seed": 2})
        await service.step(a, {"action": "Up"})
        fork = await service.fork(a)
        snap = await service.snapshot(a)
        b = service.sessions.open("ws")
        await service.restore(b, {"snapshot": snap})
        branched = [h for h in journal.heard if h[0] == "branched"]
        assert branched == [("branched", fork["session_id"], 2, (("Up",),)),
                            ("branched", b.id, 2, (("Up",),))]
        with pytest.raises(Exception, match="snapshot refused"):
            await service.restore(b, {"snapshot": {**snap, "seed": 3}})
        assert len([h for h in journal.heard if h[0] == "branched"]) == 2

    with PoolEngine(ServeSettings(env="sokoban", max_sessions=4, backend="sequential")
                    ) as engine:
        service = Service(engine)
        journal = Recorder()
        service.sessions.journal = journal
        asyncio.run(run(service, journal))


def test_several_fronts_fork_on_the_source_front_and_share_snapshots() -> None:
    """A fork stays on its source's front (its id says so) and is reached through any;
    a snapshot from one front restores on the other (the fronts share the key)."""
    settings = ServeSettings(env="sokoban", max_sessions=8, backend="process", num_workers=2,
                             frontends=2)
    want = _reference("sokoban", 9, ["Down", "Right", "Right"])
    with FrontGroup(settings) as group:
        with contextlib.ExitStack() as stack:
            by_front: dict[int, Any] = {}
            for _ in range(6):  # new sessions go where they cost less: both fronts soon
                ws = stack.enter_context(_ws(group.url))
                sid = _ask(ws, "reset", {"seed": 9})["data"]["metadata"]["session_id"]
                by_front.setdefault(owner_of(sid), ws)
                if len(by_front) == 2:
                    break
            assert set(by_front) == {0, 1}
            _ask(by_front[0], "step", {"action": "Down"})
            fork = _ask(by_front[0], "fork")["data"]
            assert owner_of(fork["session_id"]) == 0
            snap = _ask(by_front[0], "snapshot")["data"]["snapshot"]
            assert _ask(by_front[1], "restore", {"snapshot": snap})["type"] == "observation"
            assert _play(by_front[1], ["Right", "Right"]) == want[1:]
        with _ws(group.url, fork["session_id"]) as dst:
            assert _play(dst, ["Right", "Right"]) == want[1:]
        assert httpx.post(group.url + "/close", json={"session_id": fork["session_id"]},
                          timeout=30).json() == {"closed": True}


def test_bench_fork_measures_a_served_fork(tmp_path: Any) -> None:
    out = tmp_path / "fork.json"
    result = CliRunner().invoke(main, ["bench", "fork", "--env", "sokoban", "--forks", "5",
                                       "--place", "served", "--json", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["rows"]
    assert [(r["env"], r["place"], r["forks"]) for r in rows] == [("sokoban", "served", 5)]
    assert 0 < rows[0]["p50_us"] <= rows[0]["p99_us"] and rows[0]["snapshot_bytes"] > 0
    assert rows[0]["restore_p50_us"] > 0
    assert "served" in result.output


def test_the_slot_engine_runs_branching_calls_one_per_slot() -> None:
    with SlotEngine("sokoban", capacity=3, backend="sequential") as engine:
        a, b = engine.lease(), engine.lease()
        engine.submit_reset(a, seed=4).result(timeout=30)
        engine.submit_step(a, ["Up"]).result(timeout=30)
        step: concurrent.futures.Future[Any] = concurrent.futures.Future()
        fork: concurrent.futures.Future[Any] = concurrent.futures.Future()
        engine.submit(StepSlotRequest(a, ["Left"], step), ForkSlotRequest(a, b, fork))
        assert step.result(timeout=30).error is None
        with pytest.raises(RuntimeError, match="still running a call"):
            fork.result(timeout=30)
        into_itself: concurrent.futures.Future[Any] = concurrent.futures.Future()
        engine.submit(ForkSlotRequest(a, a, into_itself))
        with pytest.raises(ValueError, match="both the source and a destination"):
            into_itself.result(timeout=30)
        snap: concurrent.futures.Future[Any] = concurrent.futures.Future()
        engine.submit(SnapshotSlotRequest(a, snap))
        assert snap.result(timeout=30).turns == (("Up",), ("Left",))
        with pytest.raises(ValueError, match="not leased"):
            free = ({0, 1, 2} - {a, b}).pop()
            engine.submit(ForkSlotRequest(a, free, concurrent.futures.Future()))
