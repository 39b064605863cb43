"""The load client of ``turnpool bench serve`` (and the WebSocket client the other serve
benches use), run in a process of its own by `turnpool.bench.serve`:
``python -m turnpool.bench.ws_client load URL SESSIONS WARMUP SECONDS [THINK FIRST [sync]]``
or ``... hold URL SESSIONS``. ``TURNPOOL_BENCH_CLIENT`` picks the WebSocket client: ``aiohttp``
(the default: aiohttp's client, whose frame reader is compiled, so a client that is not
turnpool's measures turnpool's server) or ``turnpool`` (`WsClient`, on the server's own codec).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections import deque
from typing import Any

ACTIONS = ("Up", "Down", "Left", "Right")
#: latency quantiles each load client reports, so several clients' latencies can be merged
SKETCH = 1000


def _raise_fd_limit() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class WsClient:
    """A minimal WebSocket client over asyncio streams, on the server's own codec
    (`turnpool.serve.codec`), so the load generator costs far less CPU per message than
    either server and the two servers, not the client, set the numbers. Frames are masked
    with a zero key (allowed by the RFC; the key only matters to proxies)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        from turnpool.serve.codec import FrameDecoder

        self.reader = reader
        self.writer = writer
        self.decoder = FrameDecoder(max_bytes=2**24, masked=False)
        self.frames: deque[tuple[bool, int, bytes]] = deque()

    @classmethod
    async def connect(cls, url: str) -> WsClient:
        import base64

        from turnpool.serve.codec import upgrade_request

        host, _, port = url.removeprefix("http://").partition(":")
        reader, writer = await asyncio.open_connection(host, int(port), limit=2**24)
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(upgrade_request(host, int(port), key))
        head = await reader.readuntil(b"\r\n\r\n")
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            writer.close()
            raise ConnectionError(head.split(b"\r\n", 1)[0].decode(errors="replace"))
        return cls(reader, writer)

    def send(self, text: str, opcode: int = 0x1) -> None:
        from turnpool.serve.codec import encode_frame

        self.writer.write(encode_frame(opcode, text.encode(), mask=b"\0\0\0\0"))

    async def recv(self) -> str:
        while True:
            while not self.frames:
                data = await self.reader.read(2**16)
                if not data:
                    raise ConnectionError("closed by the server")
                self.frames.extend(self.decoder.feed(data))
            _, opcode, payload = self.frames.popleft()
            if opcode in (0x1, 0x2):
                return payload.decode()
            if opcode == 0x8:
                raise ConnectionError("closed by the server")
            if opcode == 0x9:  # ping -> pong
                self.send(payload.decode(errors="replace"), 0xA)

    async def ask(self, text: str) -> str:
        self.send(text)
        return await self.recv()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            self.send("", 0x8)
            self.writer.close()
            await asyncio.wait_for(self.writer.wait_closed(), 5)


class AiohttpClient:
    """The same three calls as `WsClient` over aiohttp's WebSocket client (one
    ``ClientSession`` per load process, no connection limit, no compression)."""

    _http: Any = None

    def __init__(self, ws: Any) -> None:
        self.ws = ws

    @classmethod
    async def connect(cls, url: str) -> AiohttpClient:
        import aiohttp

        if cls._http is None:
            cls._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        ws = await cls._http.ws_connect(url.rstrip("/") + "/ws", compress=0, autoping=True,
                                        max_msg_size=2**24)
        return cls(ws)

    async def ask(self, text: str) -> str:
        await self.ws.send_str(text)
        reply: str = await self.ws.receive_str()
        return reply

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(), 5)

    @classmethod
    async def shutdown(cls) -> None:
        if cls._http is not None:
            await cls._http.close()
            cls._http = None


#: The WebSocket clients the load can run on (``TURNPOOL_BENCH_CLIENT``).
CLIENTS: dict[str, Any] = {"aiohttp": AiohttpClient, "turnpool": WsClient}
#: The client of a bench run that names none.
DEFAULT_CLIENT = "aiohttp"


def client_class() -> Any:
    name = os.environ.get("TURNPOOL_BENCH_CLIENT") or DEFAULT_CLIENT
    if name not in CLIENTS:
        raise SystemExit(f"unknown load client {name!r}; one of {', '.join(CLIENTS)}")
    return CLIENTS[name]


def _is_observation(reply: str) -> bool:
    return reply.startswith('{"type":"observation"')


class _Sessions:
    """The closed-loop sessions of one `_load` run and what they count."""

    def __init__(self, url: str, sessions: int, connect_parallel: int, think: float,
                 first: int) -> None:
        self.url, self.sessions, self.think, self.first = url, sessions, think, first
        self.gate = asyncio.Semaphore(connect_parallel)
        self.started, self.stop = asyncio.Event(), asyncio.Event()
        self.ready = 0
        self.lat: list[float] = []
        self.counts = {"steps": 0, "all_steps": 0, "errors": 0, "refused": 0}
        #: the measured window (perf_counter), set when the sessions start
        self.window = [0.0, 0.0]
        self.steps = [json.dumps({"type": "step", "data": {"action": a}}) for a in ACTIONS]

    async def one(self, i: int) -> None:
        counts = self.counts
        try:
            async with self.gate:
                ws = await client_class().connect(self.url)
        except Exception:
            counts["refused"] += 1
            return
        try:
            reset = json.dumps({"type": "reset", "data": {"seed": self.first + i}})
            if not _is_observation(await ws.ask(reset)):
                counts["refused"] += 1
                return
            self.ready += 1
            await self.started.wait()
            if self.think:
                await asyncio.sleep(self.think * i / self.sessions)
            await self._step_until_stopped(ws, i, reset)
        except Exception:
            counts["errors"] += 1
        finally:
            await ws.close()

    async def _step_until_stopped(self, ws: Any, i: int, reset: str) -> None:
        counts, window = self.counts, self.window
        k = i
        while not self.stop.is_set():
            if self.think and k != i:
                await asyncio.sleep(self.think)
            k += 1
            t0 = time.perf_counter()
            reply = await ws.ask(self.steps[k % 4])
            t1 = time.perf_counter()
            if not _is_observation(reply):
                counts["errors"] += 1
                await ws.ask(reset)
                continue
            if not self.stop.is_set():
                counts["all_steps"] += 1
            if window[0] <= t0 and t1 <= window[1]:
                counts["steps"] += 1
                self.lat.append(t1 - t0)
            if '"done":true' in reply:
                await ws.ask(reset)


async def _load(url: str, sessions: int, warmup: float, seconds: float,
                connect_parallel: int = 64, think: float = 0.0, first: int = 0,
                sync: bool = False) -> dict[str, Any]:
    """``sessions`` closed-loop sessions (seeds from ``first``) for ``warmup + seconds``;
    counts the window only. With ``think`` each session waits that long after each reply (an
    LLM's pace), the sessions' phases spread evenly over it. With ``sync`` (one of several
    client processes) it prints ``ready`` once its sessions are open and starts when a line
    comes on stdin."""
    run = _Sessions(url, sessions, connect_parallel, think, first)
    counts = run.counts
    tasks = [asyncio.create_task(run.one(i)) for i in range(sessions)]
    deadline = time.monotonic() + 300
    while run.ready + counts["refused"] < sessions and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if sync:
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    now = time.perf_counter()
    run.window[0], run.window[1] = now + warmup, now + warmup + seconds
    run.started.set()
    print("started", flush=True)  # the parent starts counting server CPU time here
    cpu0 = time.process_time()
    await asyncio.sleep(warmup + seconds)
    run.stop.set()
    client_cpu = time.process_time() - cpu0
    print("stopped", flush=True)  # ... and stops here (closing sessions is not counted)
    await asyncio.wait(tasks, timeout=60)
    await AiohttpClient.shutdown()
    lat = sorted(run.lat)

    def pct(q: float) -> float | None:
        return lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else None

    return {"sessions": sessions, "think_s": think, "running": run.ready,
            "steps": counts["steps"], "all_steps": counts["all_steps"],
            "steps_per_s": counts["steps"] / seconds, "p50_ms": pct(0.50),
            "p99_ms": pct(0.99), "errors": counts["errors"], "refused": counts["refused"],
            "client_cpu_s": client_cpu,
            "quantiles_ms": [pct(k / SKETCH) for k in range(SKETCH)] if lat else []}


async def _hold(url: str, sessions: int, connect_parallel: int = 64) -> dict[str, Any]:
    """Open ``sessions`` sessions, reset and step each once, all held open; how many made it."""
    gate = asyncio.Semaphore(connect_parallel)
    held: list[Any] = []
    answered = 0
    step = json.dumps({"type": "step", "data": {"action": "Up"}})

    async def one(i: int) -> None:
        nonlocal answered
        try:
            async with gate:
                ws = await client_class().connect(url)
                held.append(ws)
                reset = json.dumps({"type": "reset", "data": {"seed": i}})
                if not _is_observation(await asyncio.wait_for(ws.ask(reset), 120)):
                    return
                if _is_observation(await asyncio.wait_for(ws.ask(step), 120)):
                    answered += 1
        except Exception:
            return

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(sessions)))
    took = time.perf_counter() - t0
    result = {"asked": sessions, "held": answered, "open_s": took}
    print(json.dumps(result), flush=True)  # the parent samples RSS now, then tells us to close
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await asyncio.gather(*(ws.close() for ws in held), return_exceptions=True)
    await AiohttpClient.shutdown()
    return result


def main(argv: list[str]) -> None:
    """``load URL SESSIONS WARMUP SECONDS [THINK FIRST [sync]]`` or ``hold URL SESSIONS``."""
    _raise_fd_limit()
    mode, url = argv[0], argv[1]
    if mode == "load":
        think = float(argv[5]) if len(argv) > 5 else 0.0
        first = int(argv[6]) if len(argv) > 6 else 0
        out = asyncio.run(_load(url, int(argv[2]), float(argv[3]), float(argv[4]),
                                think=think, first=first, sync=len(argv) > 7))
        print(json.dumps(out), flush=True)
    else:
        asyncio.run(_hold(url, int(argv[2])))


if __name__ == "__main__":
    main(sys.argv[1:])
