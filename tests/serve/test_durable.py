"""Durable sessions end to end: a real ``turnpool serve --state-dir`` process holding 1,024
WebSocket sessions mid-episode is killed with SIGKILL and started again on the same
directory; every client reconnects with its session id and its session continues exactly as
an uninterrupted env with the same seed and actions does (0 lost). With several fronts, a
front killed with SIGKILL is restarted by its supervisor with the sessions it held."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

import turnpool
from turnpool.serve.codec import FrameDecoder, encode_frame, upgrade_request

pytestmark = pytest.mark.timeout(300)
SESSIONS = 1024
MOVES = ["Up", "Down", "Left", "Right"]


class Server:
    """``turnpool serve`` in a child process (its stderr in ``log``)."""

    def __init__(self, state_dir: Path, log: Path) -> None:
        cmd = [sys.executable, "-m", "turnpool.cli", "serve", "--env", "sokoban",
               "--backend", "sequential", "--port", "0", "--max-sessions", str(SESSIONS + 8),
               "--state-dir", str(state_dir)]
        self.log = log.open("ab")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        line = self._first_line(120.0)
        assert "http://" in line, f"the server did not start: {line!r}, {log.read_text()}"
        self.url = next(w for w in line.split() if w.startswith("http://")).rstrip(",")

    def _first_line(self, timeout: float) -> str:
        out = self.proc.stdout
        assert out is not None
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(out.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        return got[0] if got else ""

    def stop(self, sig: int) -> int:
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=60)
        self.log.close()
        return code


class Ws:
    """A minimal WebSocket client on the server's own codec (many at once, cheaply)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = FrameDecoder(max_bytes=2**24, masked=False)
        self.frames: deque[tuple[bool, int, bytes]] = deque()

    @classmethod
    async def connect(cls, url: str, path: str = "/ws") -> Ws:
        host, _, port = url.removeprefix("http://").partition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(upgrade_request(host, int(port), key, path))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
        assert b" 101 " in head.split(b"\r\n", 1)[0], head
        return cls(reader, writer)

    async def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        self.writer.write(encode_frame(0x1, json.dumps(message).encode(), mask=b"\0\0\0\0"))
        while not self.frames:
            data = await asyncio.wait_for(self.reader.read(2**16), 60)
            if not data:
                raise ConnectionError("closed by the server")
            self.frames.extend(self.decoder.feed(data))
        _, opcode, payload = self.frames.popleft()
        assert opcode == 0x1, (opcode, payload)
        reply: dict[str, Any] = json.loads(payload)
        return reply

    async def end(self) -> None:
        """Close the session and wait for the server's close frame (its session is gone)."""
        self.writer.write(encode_frame(0x1, b'{"type":"close"}', mask=b"\0\0\0\0"))
        while not any(opcode == 0x8 for _, opcode, _ in self.frames):
            data = await asyncio.wait_for(self.reader.read(2**16), 60)
            if not data:
                break
            self.frames.extend(self.decoder.feed(data))
        self.close()

    def close(self) -> None:
        self.writer.close()


def _plan(i: int) -> tuple[int, list[str], int]:
    """Session ``i``'s seed, its moves, and how many it makes before the kill."""
    rng = random.Random(i)
    return 5000 + i, [rng.choice(MOVES) for _ in range(8)], 1 + i % 5


def _reference(i: int) -> list[tuple[str, float, bool]]:
    """What an uninterrupted env answers to session ``i``'s moves (until its episode ends)."""
    seed, moves, _ = _plan(i)
    env = turnpool.make("sokoban")
    env.reset(seed=seed)
    out = []
    for move in moves:
        obs, reward, terminated, truncated, _ = env.step(move)
        out.append((obs, reward, terminated or truncated))
        if terminated or truncated:
            break
    return out


def _answer(reply: dict[str, Any]) -> tuple[str, float, bool]:
    assert reply["type"] == "observation", reply
    data = reply["data"]
    return data["observation"]["text"], data["reward"], data["done"]


async def _moves(ws: Ws, moves: list[str]) -> list[Any]:
    out = []
    for move in moves:
        reply = await ws.ask({"type": "step", "data": {"action": move}})
        if reply["type"] == "error":
            out.append(reply["data"]["message"])
            continue
        out.append(_answer(reply))
    return out


def _expected(ref: list[tuple[str, float, bool]], start: int, n: int) -> list[Any]:
    """The answers to moves ``start .. start+n`` given the reference (an episode that ended
    refuses the moves after it)."""
    return [ref[k] if k < len(ref) else "the episode is over: send reset"
            for k in range(start, start + n)]


async def _before(url: str) -> tuple[list[Ws], list[tuple[str, dict[str, Any]]]]:
    """Open every session, reset it and make its first moves: the clients (still
    connected), and each session's id and state."""
    gate = asyncio.Semaphore(64)

    async def one(i: int) -> tuple[Ws, str, dict[str, Any]]:
        seed, moves, k = _plan(i)
        async with gate:
            ws = await Ws.connect(url)
        reset = await ws.ask({"type": "reset", "data": {"seed": seed, "episode_id": f"e{i}"}})
        assert reset["data"]["metadata"]["seed"] == seed
        assert await _moves(ws, moves[:k]) == _expected(_reference(i), 0, k)
        state = (await ws.ask({"type": "state"}))["data"]
        return ws, state["session_id"], state

    held = await asyncio.gather(*(one(i) for i in range(SESSIONS)))
    return [ws for ws, _, _ in held], [(sid, state) for _, sid, state in held]


async def _after(url: str, sessions: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Reconnect every session by id, go on with its moves and close it: the sessions that
    did not continue exactly, and why."""
    gate = asyncio.Semaphore(64)
    wrong: list[str] = []

    async def one(i: int, sid: str, before: dict[str, Any]) -> None:
        _, moves, k = _plan(i)
        try:
            async with gate:
                ws = await Ws.connect(url, f"/ws?session_id={sid}")
            state = (await ws.ask({"type": "state"}))["data"]
            if state != before:
                wrong.append(f"{i}: state {state} != {before}")
            got = await _moves(ws, moves[k:k + 3])
            if got != _expected(_reference(i), k, 3):
                wrong.append(f"{i}: moves {got}")
            await ws.end()
        except (AssertionError, ConnectionError, OSError, asyncio.TimeoutError) as exc:
            wrong.append(f"{i}: {exc!r}")

    await asyncio.gather(*(one(i, sid, st) for i, (sid, st) in enumerate(sessions)))
    return wrong


async def _scenario(tmp_path: Path) -> None:
    state_dir, log = tmp_path / "state", tmp_path / "server.log"
    server = Server(state_dir, log)
    clients: list[Ws] = []
    try:
        clients, sessions = await _before(server.url)
        assert len({sid for sid, _ in sessions}) == SESSIONS
        # killed while every session is held mid-episode by its connected client
        assert server.stop(signal.SIGKILL) == -signal.SIGKILL
    finally:
        for ws in clients:
            ws.close()
        if server.proc.poll() is None:
            server.stop(signal.SIGKILL)
    server = Server(state_dir, log)
    try:
        assert f"resumed {SESSIONS} sessions" in log.read_text()
        status = httpx.get(server.url + "/api/status", timeout=30).json()
        assert status["active_sessions"] == SESSIONS
        assert await _after(server.url, sessions) == []
        # each reconnected WebSocket took its session back: its close ended it
        status = httpx.get(server.url + "/api/status", timeout=30).json()
        assert status["active_sessions"] == 0
    finally:
        assert server.stop(signal.SIGTERM) == 0


def test_a_killed_server_resumes_every_session_exactly(tmp_path: Path) -> None:
    asyncio.run(_scenario(tmp_path))


def test_a_killed_front_comes_back_with_its_sessions(tmp_path: Path) -> None:
    from websockets.sync.client import connect

    from turnpool.serve import ServeSettings
    from turnpool.serve.fronts import FrontGroup

    def ask(ws: Any, message: dict[str, Any]) -> dict[str, Any]:
        ws.send(json.dumps(message))
        reply: dict[str, Any] = json.loads(ws.recv(timeout=60))
        return reply

    settings = ServeSettings(env="sokoban", max_sessions=32, backend="sequential",
                             frontends=2, num_workers=2)
    with FrontGroup(settings, state_dir=str(tmp_path)) as group, ExitStack() as clients:
        ws_url = group.url.replace("http://", "ws://") + "/ws"
        held = {}
        for i in range(16):
            ws = clients.enter_context(connect(ws_url, open_timeout=60))
            seed, moves, k = _plan(i)
            ask(ws, {"type": "reset", "data": {"seed": seed}})
            for move in moves[:k]:
                ask(ws, {"type": "step", "data": {"action": move}})
            held[i] = (ws, ask(ws, {"type": "state"})["data"])
        on_front1 = [i for i, (_, st) in held.items() if st["session_id"].startswith("f1-")]
        assert 0 < len(on_front1) < 16  # sessions on both fronts
        first = group.pids
        os.kill(first[1], signal.SIGKILL)
        end = time.monotonic() + 120
        while not (group.pids[1] != first[1] and group.alive()):  # restarted (bounded)
            assert time.monotonic() < end, "front 1 was not restarted"
            time.sleep(0.05)
        assert group.restarts == 1
        for i, (ws, before) in held.items():
            _, moves, k = _plan(i)
            if i in on_front1:  # its connection died with the front: come back by id
                ws.close()
                ws = clients.enter_context(connect(f"{ws_url}?session_id={before['session_id']}",
                                                   open_timeout=60))
            assert ask(ws, {"type": "state"})["data"] == before
            got = []
            for move in moves[k:k + 3]:
                reply = ask(ws, {"type": "step", "data": {"action": move}})
                got.append(reply["data"]["message"] if reply["type"] == "error"
                           else _answer(reply))
            assert got == _expected(_reference(i), k, 3), i
            ws.close()

