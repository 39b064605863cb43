"""The session journal of ``turnpool serve --state-dir`` on its own: what it records reads
back as the live sessions, a torn last record is ignored and anything else broken is an
error, compaction keeps exactly the live sessions, branch records replay, and a server
resumed from it (in this process) continues each session where it was answered."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

import turnpool
import turnpool.serve.journal as journal_mod
from turnpool.serve import ServeSettings, TurnpoolServer
from turnpool.serve.journal import FILE_NAME, FileJournal, JournalError, SessionRecord, read

pytestmark = pytest.mark.timeout(120)
ENV = {"env": "bandit", "env_kwargs": {}}


def _journal(d: Path, fsync: str = "never", **kwargs: Any) -> FileJournal:
    return FileJournal(d, ENV, fsync=fsync, **kwargs)


def test_what_is_recorded_reads_back_as_the_live_sessions(tmp_path: Path) -> None:
    episodes = {"a": "ep-a", "b": None}
    j = _journal(tmp_path, episode_of=episodes.get)
    j.opened("a", "ws")
    j.reset("a", 5)
    j.step("a", ["left"])
    j.step("a", ["right", 2])
    j.opened("b", "http")
    j.opened("gone", "mcp")
    j.reset("gone", 1)
    j.closed("gone")
    j.reset("once", 3)  # never opened: a one-call session, not kept
    j.close()
    assert read(tmp_path / FILE_NAME, ENV) == {
        "a": SessionRecord("ws", 5, "ep-a", [("left",), ("right", 2)]),
        "b": SessionRecord("http")}


def test_a_reset_starts_the_turns_again(tmp_path: Path) -> None:
    j = _journal(tmp_path)
    j.opened("a", "ws")
    j.reset("a", 1)
    j.step("a", ["x"])
    j.reset("a", 2)
    j.step("a", ["y"])
    j.close()
    assert read(tmp_path / FILE_NAME, ENV)["a"] == SessionRecord("ws", 2, None, [("y",)])


def test_branch_records_replay_as_the_snapshot_they_name(tmp_path: Path) -> None:
    j = _journal(tmp_path)
    j.opened("src", "ws")
    j.reset("src", 4)
    j.step("src", ["a"])
    j.opened("fork", "ws")
    j.branched("fork", 4, (("a",),))
    j.step("fork", ["b"])
    j.step("src", ["c"])
    j.close()
    live = read(tmp_path / FILE_NAME, ENV)
    assert live["fork"] == SessionRecord("ws", 4, None, [("a",), ("b",)])
    assert live["src"] == SessionRecord("ws", 4, None, [("a",), ("c",)])


def test_a_torn_last_record_is_ignored(tmp_path: Path) -> None:
    j = _journal(tmp_path)
    j.opened("a", "ws")
    j.reset("a", 1)
    j.step("a", ["kept"])
    j.close()
    path = tmp_path / FILE_NAME
    whole = path.read_bytes()
    torn = b'["s","a",["lo'
    path.write_bytes(whole + torn)
    assert read(path, ENV)["a"].turns == [("kept",)]
    path.write_bytes(whole + b"garbage\n")  # a last line the crash left unreadable
    assert read(path, ENV)["a"].turns == [("kept",)]
    again = _journal(tmp_path)  # opening compacts the torn record away
    assert again.sessions["a"].turns == [("kept",)]
    again.step("a", ["next"])
    again.close()
    assert read(path, ENV)["a"].turns == [("kept",), ("next",)]
    assert torn not in path.read_bytes()


def test_a_broken_record_before_the_end_is_an_error(tmp_path: Path) -> None:
    j = _journal(tmp_path)
    j.opened("a", "ws")
    j.close()
    path = tmp_path / FILE_NAME
    path.write_bytes(path.read_bytes() + b"not json\n" + b'["c","a"]\n')
    with pytest.raises(JournalError, match="record 3 is unreadable"):
        read(path, ENV)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / FILE_NAME).write_bytes(b'{"some": "file"}\n')
    with pytest.raises(JournalError, match="not a turnpool session journal"):
        read(tmp_path / "other" / FILE_NAME, ENV)


def test_a_journal_of_another_env_is_refused(tmp_path: Path) -> None:
    _journal(tmp_path).close()
    with pytest.raises(JournalError, match="holds sessions of"):
        FileJournal(tmp_path, {"env": "sokoban", "env_kwargs": {}})


def test_compaction_keeps_exactly_the_live_sessions(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journal_mod, "COMPACT_MIN_BYTES", 4096)
    j = _journal(tmp_path)
    path = tmp_path / FILE_NAME
    j.opened("live", "http")
    j.reset("live", 9)
    sizes = []
    for i in range(400):  # sessions that come and go: the file must not keep them
        sid = f"s{i}"
        j.opened(sid, "ws")
        j.reset(sid, i)
        j.step(sid, [f"move {i}"])
        j.closed(sid)
        j.step("live", [i])
        sizes.append(path.stat().st_size)
    j.close()
    assert max(sizes) < 4 * 4096 + 200  # compacted while running, not only at start
    assert read(path, ENV) == {"live": SessionRecord("http", 9, None,
                                                     [(i,) for i in range(400)])}
    _journal(tmp_path).close()  # opening compacts: one header, then "o" + "b" per session
    lines = path.read_bytes().splitlines()
    assert [json.loads(x)[0] for x in lines] == ["turnpool-sessions", "o", "b"]


def test_the_fsync_policy_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="always, batch, never"):
        FileJournal(tmp_path, ENV, fsync="sometimes")
    for policy in journal_mod.FSYNC_POLICIES:
        j = FileJournal(tmp_path / policy, ENV, fsync=policy)
        j.opened("a", "ws")
        j.reset("a", 2)
        j.close()
        assert read(tmp_path / policy / FILE_NAME, ENV)["a"].seed == 2


def test_the_cli_offers_the_journals_fsync_policies() -> None:
    from turnpool.cli.serve import FSYNC_POLICIES

    assert FSYNC_POLICIES == journal_mod.FSYNC_POLICIES


def test_a_stopped_server_resumes_its_http_sessions_where_they_were(tmp_path: Path) -> None:
    settings = ServeSettings(env="sokoban", max_sessions=4, max_http_sessions=4,
                             backend="sequential")
    actions = ["Up", "Left", "Down", "Right", "Up"]
    ids = []
    with TurnpoolServer(settings, state_dir=tmp_path) as server:
        for seed in (11, 12):
            out = httpx.post(server.url + "/reset", json={"seed": seed, "stateful": True,
                                                          "episode_id": f"ep{seed}"},
                             timeout=30).json()
            sid = out["metadata"]["session_id"]
            ids.append(sid)
            for a in actions[:3]:
                httpx.post(server.url + "/step", json={"session_id": sid,
                                                       "action": {"action": a}}, timeout=30)
        closed = httpx.post(server.url + "/reset", json={"seed": 1, "stateful": True},
                            timeout=30).json()["metadata"]["session_id"]
        httpx.post(server.url + "/close", json={"session_id": closed}, timeout=30)
    with TurnpoolServer(settings, state_dir=tmp_path) as server:
        assert server.resumed is not None
        assert (server.resumed.sessions, server.resumed.turns) == (2, 6)
        for seed, sid in zip((11, 12), ids):
            state = httpx.get(server.url + "/state", params={"session_id": sid},
                              timeout=30).json()
            assert (state["seed"], state["step_count"], state["episode_id"]) == \
                (seed, 3, f"ep{seed}")
            env = turnpool.make("sokoban")
            env.reset(seed=seed)
            for a in actions[:3]:
                env.step(a)
            for a in actions[3:]:
                got = httpx.post(server.url + "/step", json={
                    "session_id": sid, "action": {"action": a}}, timeout=30).json()
                assert "observation" in got, got
                obs, reward, terminated, truncated, _ = env.step(a)
                assert (got["observation"]["text"], got["reward"], got["done"]) == \
                    (obs, reward, terminated or truncated)
                if got["done"]:  # seed 12 is solved by "Right"
                    break
        unknown = httpx.get(server.url + "/state", params={"session_id": closed},
                            timeout=30)
        assert unknown.status_code >= 400


def test_the_cli_refuses_a_state_dir_it_cannot_resume(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from turnpool.cli import main

    _journal(tmp_path).close()  # a journal of bandit sessions
    out = CliRunner().invoke(main, ["serve", "--env", "sokoban", "--backend", "sequential",
                                    "--port", "0", "--state-dir", str(tmp_path)])
    assert out.exit_code == 2 and "holds sessions of" in out.output


class Slots:
    """A slot engine's lease book (what the session table needs of one)."""

    capacity = 2

    def __init__(self) -> None:
        self.free = [0, 1]

    def lease(self, near: int | None = None) -> int:
        return self.free.pop()

    def release(self, slot: int) -> None:
        self.free.append(slot)

    def abandon(self, slot: int) -> None:
        pass


class Peer:
    def send(self, text: str) -> None:
        pass

    def end(self, code: int = 1000) -> None:
        pass


def test_a_resumed_websocket_session_waits_for_its_client_then_ends_with_it(
        tmp_path: Path) -> None:
    from turnpool.serve.sessions import SessionTable

    table = SessionTable(Slots(), ServeSettings(http_session_timeout=5.0))
    table.journal = _journal(tmp_path)
    waiting = table.resume("w", "ws")
    back = table.resume("b", "ws")
    assert table.sweep(now=waiting.last_active + 4.0) == []
    peer = Peer()
    table.attach("b", peer)
    assert table.sweep(now=waiting.last_active + 6.0) == [waiting]  # its client never came
    assert table.get("b") is back  # a held WebSocket session has no idle limit
    table.detach(back, peer)  # its connection ended: so did the session
    assert table.get("b") is None and len(table) == 0
    assert table.journal.sessions == {}  # type: ignore[attr-defined]


def test_a_websocket_session_outlives_a_graceful_restart(tmp_path: Path) -> None:
    from websockets.sync.client import connect

    settings = ServeSettings(env="sokoban", max_sessions=2, backend="sequential")
    server = TurnpoolServer(settings, state_dir=tmp_path)
    try:
        with connect(server.url.replace("http://", "ws://") + "/ws", open_timeout=30) as ws:
            ws.send(json.dumps({"type": "reset", "data": {"seed": 21}}))
            ws.recv(timeout=30)
            ws.send(json.dumps({"type": "step", "data": {"action": "Left"}}))
            ws.recv(timeout=30)
            ws.send(json.dumps({"type": "state"}))
            before = json.loads(ws.recv(timeout=30))["data"]
            server.stop()  # its shutdown ends the connection; the journal keeps the session
    finally:
        server.stop()
    with TurnpoolServer(settings, state_dir=tmp_path) as server:
        url = server.url.replace("http://", "ws://") + f"/ws?session_id={before['session_id']}"
        with connect(url, open_timeout=30) as ws:
            ws.send(json.dumps({"type": "state"}))
            assert json.loads(ws.recv(timeout=30))["data"] == before
            ws.send(json.dumps({"type": "step", "data": {"action": "Up"}}))
            got = json.loads(ws.recv(timeout=30))["data"]
    env = turnpool.make("sokoban")
    env.reset(seed=21)
    env.step("Left")
    assert got["observation"]["text"] == env.step("Up")[0]


def test_a_journal_that_cannot_be_written_fails_the_call_not_the_server(
        tmp_path: Path) -> None:
    import os

    from turnpool.serve.errors import ProtocolError
    from turnpool.serve.sessions import SessionTable

    slots = Slots()
    table = SessionTable(slots, ServeSettings())
    table.journal = j = _journal(tmp_path)
    kept = table.open("http")
    os.close(j._fd)
    j._fd = os.open("/dev/full", os.O_WRONLY)  # every write: ENOSPC, as on a full disk
    with pytest.raises(ProtocolError) as full:
        j.step(kept.id, ["x"])
    assert full.value.status == 507 and "cannot be written" in full.value.message
    with pytest.raises(ProtocolError):
        table.open("ws")
    assert slots.free == [0] and len(table) == 1  # the refused open holds no slot
    table.close(kept)  # a close that cannot be recorded is still a close
    assert len(table) == 0 and sorted(slots.free) == [0, 1]
    j.close()


def test_a_branched_session_resumes_as_its_snapshot(tmp_path: Path) -> None:
    settings = ServeSettings(env="sokoban", max_sessions=2, max_http_sessions=2,
                             backend="sequential")
    j = FileJournal(tmp_path, {"env": "sokoban", "env_kwargs": {}}, fsync="never")
    j.opened("copy", "http")  # a served fork's new session: seed 12 after two turns
    j.branched("copy", 12, (("Up",), ("Left",)))
    j.close()
    with TurnpoolServer(settings, state_dir=tmp_path) as server:
        got = httpx.post(server.url + "/step", json={"session_id": "copy",
                                                     "action": {"action": "Down"}},
                         timeout=30).json()
    env = turnpool.make("sokoban")
    env.reset(seed=12)
    env.step("Up")
    env.step("Left")
    obs, reward, *_ = env.step("Down")
    assert (got["observation"]["text"], got["reward"]) == (obs, reward)
    assert got["metadata"]["step_count"] == 3


def test_a_snapshot_taken_before_a_restart_restores_after_it(tmp_path: Path) -> None:
    """The signing key is kept in the state dir: a server restarted on it accepts the
    snapshots its predecessor handed out; a server without it refuses them."""
    settings = ServeSettings(env="sokoban", max_sessions=2, max_http_sessions=2,
                             backend="sequential")
    with TurnpoolServer(settings, state_dir=tmp_path) as server:
        sid = httpx.post(server.url + "/reset", json={"seed": 5, "stateful": True},
                         timeout=30).json()["metadata"]["session_id"]
        httpx.post(server.url + "/step", json={"session_id": sid,
                                               "action": {"action": "Up"}}, timeout=30)
        snap = httpx.post(server.url + "/snapshot", json={"session_id": sid},
                          timeout=30).json()["snapshot"]
    assert (tmp_path / "snapshot.key").stat().st_mode & 0o077 == 0
    with TurnpoolServer(settings, state_dir=tmp_path) as server:
        got = httpx.post(server.url + "/restore", json={"snapshot": snap}, timeout=30).json()
        nxt = httpx.post(server.url + "/step", json={
            "session_id": got["metadata"]["session_id"], "action": {"action": "Left"}},
            timeout=30).json()
    with TurnpoolServer(dataclasses.replace(settings, snapshot_key="another")) as stranger:
        refused = httpx.post(stranger.url + "/restore", json={"snapshot": snap}, timeout=30)
    env = turnpool.make("sokoban")
    env.reset(seed=5)
    obs, *_ = env.step("Up")
    assert got["observation"]["text"] == obs
    assert nxt["observation"]["text"] == env.step("Left")[0]
    assert refused.status_code >= 400
