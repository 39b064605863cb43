"""The one ``/ws`` path of ``turnpool serve`` (`turnpool.serve.ws`): RFC 6455 framing as
clients really send it (frames split across TCP writes, several in one write, fragmented
messages, binary frames, pings), the HTTP routes on the same port, a keep-alive connection
that upgrades after an HTTP request (uvicorn parses it, the same ``/ws`` path serves it),
protocol errors, a client that leaves with a step in flight, and a server stopped with
sessions open."""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

import turnpool
from turnpool.serve import ServeSettings, TurnpoolServer
from turnpool.serve.codec import accept_key

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server() -> Iterator[TurnpoolServer]:
    settings = ServeSettings(env="sokoban", max_sessions=2, backend="thread", num_workers=1)
    with TurnpoolServer(settings) as srv:
        yield srv


class RawWs:
    """A WebSocket client over a plain socket, writing frames byte for byte."""

    def __init__(self, url: str, path: str = "/ws") -> None:
        host, port = url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            self.buf += self._read()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        self.head = head.decode()
        assert f"Sec-WebSocket-Accept: {accept_key(key)}" in self.head, self.head

    def _read(self) -> bytes:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("closed")
        return data

    @staticmethod
    def frame(payload: bytes, opcode: int = 0x1, fin: bool = True, masked: bool = True
              ) -> bytes:
        mask = os.urandom(4) if masked else b""
        n = len(payload)
        b0 = (0x80 if fin else 0) | opcode
        mbit = 0x80 if masked else 0
        if n < 126:
            head = bytes((b0, mbit | n))
        elif n < 65536:
            head = struct.pack("!BBH", b0, mbit | 126, n)
        else:
            head = struct.pack("!BBQ", b0, mbit | 127, n)
        body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload)) if masked else payload
        return head + mask + body

    def recv(self) -> tuple[int, bytes]:
        """The next frame from the server: (opcode, payload)."""
        while True:
            if len(self.buf) >= 2:
                n = self.buf[1] & 0x7F
                at = {126: 4, 127: 10}.get(n, 2)
                if n >= 126 and len(self.buf) >= at:
                    n = int.from_bytes(self.buf[2:at], "big")
                if len(self.buf) >= at and len(self.buf) >= at + n:
                    opcode, payload = self.buf[0] & 0x0F, self.buf[at:at + n]
                    self.buf = self.buf[at + n:]
                    return opcode, payload
            self.buf += self._read()

    def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        self.sock.sendall(self.frame(json.dumps(message).encode()))
        return self.reply()

    def reply(self) -> dict[str, Any]:
        opcode, payload = self.recv()
        assert opcode == 0x1, (opcode, payload)
        out: dict[str, Any] = json.loads(payload)
        return out

    def close(self) -> None:
        self.sock.close()


def test_frames_split_batched_fragmented_binary_and_pinged(server: TurnpoolServer) -> None:
    ws = RawWs(server.url)
    try:
        want, _ = turnpool.make("sokoban").reset(seed=4)
        # a reset frame written one byte at a time
        for b in RawWs.frame(json.dumps({"type": "reset", "data": {"seed": 4}}).encode()):
            ws.sock.sendall(bytes([b]))
        assert ws.reply()["data"]["observation"]["text"] == want
        # three steps in one write: three replies, in order, step counts 1..3
        steps = b"".join(RawWs.frame(json.dumps({"type": "step", "data": {"action": a}})
                                     .encode()) for a in ("Up", "Left", "Down"))
        ws.sock.sendall(steps)
        counts = [ws.reply()["data"]["metadata"]["step_count"] for _ in range(3)]
        assert counts == [1, 2, 3]
        # a message in three fragments (a ping between them), then a binary frame
        text = json.dumps({"type": "state"}).encode()
        ws.sock.sendall(RawWs.frame(text[:3], fin=False) + RawWs.frame(text[3:7], 0x0, False)
                        + RawWs.frame(b"hi", 0x9) + RawWs.frame(text[7:], 0x0))
        assert ws.recv() == (0xA, b"hi")
        assert ws.reply()["data"]["step_count"] == 3
        ws.sock.sendall(RawWs.frame(text, 0x2))
        assert ws.reply()["type"] == "state"
        # a long step message (16-bit length) and a malformed one keep the session going
        assert ws.ask({"type": "reset", "data": {"seed": 5}})["type"] == "observation"
        long_step = {"type": "step", "data": {"action": "Up", "metadata": {"x": "y" * 300}}}
        got = ws.ask(long_step)
        assert got["type"] == "observation", got
        assert ws.ask({"type": "step", "data": {"action": True}})["data"]["code"] == \
            "VALIDATION_ERROR"
        ws.sock.sendall(RawWs.frame(b"{not json"))
        assert ws.reply()["data"]["code"] == "INVALID_JSON"
        # close: the server answers with a close frame and the session is gone
        ws.sock.sendall(RawWs.frame(struct.pack("!H", 1000), 0x8))
        assert ws.recv() == (0x8, struct.pack("!H", 1000))
        # the loop ended the session before it read the next request
        assert _active(server.url) == 0
    finally:
        ws.close()


def test_an_unmasked_frame_is_a_protocol_error(server: TurnpoolServer) -> None:
    ws = RawWs(server.url)
    try:
        ws.sock.sendall(RawWs.frame(b'{"type": "state"}', masked=False))
        assert ws.recv() == (0x8, struct.pack("!H", 1002))
    finally:
        ws.close()


def test_http_routes_and_a_keep_alive_upgrade_share_the_port(server: TurnpoolServer) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.get("/health").json() == {"status": "healthy"}
        assert http.post("/reset", json={"seed": 2}).status_code == 200
    # an HTTP request, then an upgrade on the same connection: uvicorn parses it and hands it
    # to the same /ws path
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        got = b""
        while b'"healthy"' not in got:
            got += sock.recv(65536)
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall((f"GET /ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
                      f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                      "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        got = b""
        while b"\r\n\r\n" not in got:
            got += sock.recv(65536)
        assert got.startswith(b"HTTP/1.1 101"), got


def test_a_client_that_leaves_mid_step_frees_its_slot_after_the_step() -> None:
    settings = ServeSettings(env="sleep", env_kwargs={"sleep_ms": 500.0}, max_sessions=1,
                             backend="thread", num_workers=1)
    with TurnpoolServer(settings) as srv:
        ws = RawWs(srv.url)
        assert ws.ask({"type": "reset", "data": {"seed": 1}})["type"] == "observation"
        ws.sock.sendall(RawWs.frame(json.dumps({"type": "step", "data": {"action": "a"}})
                                    .encode()))
        ws.close()  # the server reads the step before the EOF: the step is still running
        # in the pool, and its slot is not leased meanwhile
        busy = RawWs(srv.url)
        assert busy.reply()["data"]["code"] == "CAPACITY_REACHED"
        busy.close()
        assert _active(srv.url, 0) == 0  # freed once the step ended
        with connect(srv.url.replace("http://", "ws://") + "/ws", open_timeout=30) as again:
            again.send(json.dumps({"type": "reset", "data": {"seed": 2}}))
            assert json.loads(again.recv(timeout=30))["type"] == "observation"


def test_stopping_the_server_closes_open_sessions() -> None:
    settings = ServeSettings(env="trivial", max_sessions=2, backend="thread", num_workers=1)
    srv = TurnpoolServer(settings)
    ws = RawWs(srv.url)
    try:
        assert ws.ask({"type": "reset", "data": {"seed": 1}})["type"] == "observation"
        t0 = time.monotonic()
        srv.stop()
        assert time.monotonic() - t0 < 3.0  # no wait for the graceful-shutdown timeout
        assert ws.recv() == (0x8, struct.pack("!H", 1012))
    finally:
        ws.close()
        srv.stop()


def _active(url: str, want: int | None = None) -> int:
    """Sessions the server holds (with ``want``: polled, within 30 s, until it is that)."""
    deadline = time.monotonic() + 30
    while True:
        n: int = httpx.get(url + "/api/status", timeout=30).json()["active_sessions"]
        if want is None or n == want or time.monotonic() > deadline:
            return n
        time.sleep(0.02)
