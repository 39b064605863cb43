"""``turnpool bench fork``: what branching an env mid-episode costs.

For each env (default Sokoban, FrozenLake, Countdown, WebShop) and each place
(``in-process``: the ``sequential`` backend; ``process``: two worker processes, the source on
one and the destination on the other; ``process-same``: both on the source's worker, one
``Op.FORK`` message; ``served``: a real ``turnpool serve`` child process on
127.0.0.1 with two process workers, driven over ``/ws`` by a blocking socket client in this
process), an episode is reset with one seed, takes one step (Countdown: none, its episodes
are one answer long; WebShop: its oracle's first action, a search) and is forked ``--forks``
times, each timed with ``time.perf_counter``: in-process and process, ``pool.fork(0,
[dst])`` on a pool of four envs; served, the round trip of one ``{"type": "fork"}`` message
(its new session is closed after the timing, with an MCP frame on the same socket).
Reported: fork latency p50 / p99 in microseconds, forks/s (calls over their summed time, one
caller) and the snapshot's size in bytes (the pickled `Snapshot` of the source; served: the
JSON value ``{"type": "snapshot"}`` answers). Served rows also time ``{"type": "restore"}``
of that value into the source session (p50 of ``--forks`` round trips): a served snapshot
carries no env state, so a restore is a reset plus a replay of its turns.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import socket
import sys
import time
from pathlib import Path
from typing import Any

import click

from turnpool.bench.harness import json_option, machine_info
from turnpool.pool import EnvPool

#: env -> its first action (None: fork right after the reset; "oracle": the env's oracle's)
FIRST_ACTION: dict[str, Any] = {"sokoban": "Up", "frozen_lake": "Left", "countdown": None,
                                "webshop": "oracle"}
PLACES = {"in-process": ("sequential", 1, 1), "process": ("process", 2, 3),
          "process-same": ("process", 2, 1), "served": ("process", 2, 0)}


def first_action(env: str, obs: str) -> Any:
    """The action env 0 takes before it is forked (None: none)."""
    action = FIRST_ACTION[env]
    if action != "oracle":
        return action
    from turnpool.envs.registry import oracle_for, resolve

    return oracle_for(env)(obs, dict(resolve(env)[1]))[0]


def measure(env: str, place: str, forks: int) -> dict[str, Any]:
    """One row: ``forks`` forks of an episode of ``env`` at ``place``."""
    restores: list[float] = []
    if place == "served":
        times, size, restores = _served(env, forks)
    else:
        times, size = _pool(env, place, forks)
    times.sort()
    return {"env": env, "place": place, "forks": forks,
            "p50_us": 1e6 * times[len(times) // 2],
            "p99_us": 1e6 * times[min(len(times) - 1, int(len(times) * 0.99))],
            "forks_per_s": len(times) / sum(times), "snapshot_bytes": size,
            "restore_p50_us": 1e6 * sorted(restores)[len(restores) // 2] if restores
            else None}


def _pool(env: str, place: str, forks: int) -> tuple[list[float], int]:
    backend, workers, dst = PLACES[place]
    with EnvPool(env, env_num=4, seed=0, backend=backend, num_workers=workers) as pool:
        obs, _ = pool.reset(seed=1)
        action = first_action(env, obs[0])
        if action is not None:
            pool.step([action], env_ids=[0])
        size = len(pickle.dumps(pool.snapshot([0])[0]))
        for _ in range(min(50, forks)):  # warm-up
            pool.fork(0, [dst])
        times = []
        for _ in range(forks):
            t0 = time.perf_counter()
            pool.fork(0, [dst])
            times.append(time.perf_counter() - t0)
    return times, size


class BlockingWs:
    """A blocking WebSocket client on the server's own codec (`turnpool.serve.codec`): one
    ``ask`` writes one frame and reads one reply, nothing else between."""

    def __init__(self, url: str) -> None:
        from turnpool.serve.codec import FrameDecoder, upgrade_request

        host, port = url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(upgrade_request(host, int(port), key))
        head = b""
        while b"\r\n\r\n" not in head:
            head += self._read()
        self.decoder = FrameDecoder(2**24, masked=False)
        self.frames = self.decoder.feed(head.split(b"\r\n\r\n", 1)[1])

    def _read(self) -> bytes:
        data = self.sock.recv(1 << 16)
        if not data:
            raise ConnectionError("the server closed the connection")
        return data

    def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        from turnpool.serve.codec import OP_TEXT, encode_frame

        self.sock.sendall(encode_frame(OP_TEXT, json.dumps(message).encode(), b"\0\0\0\0"))
        while not self.frames:
            self.frames = self.decoder.feed(self._read())
        _, _, payload = self.frames.pop(0)
        reply: dict[str, Any] = json.loads(payload)
        if reply.get("type") == "error":
            raise RuntimeError(f"the server refused {message['type']}: {reply['data']}")
        return reply

    def close(self) -> None:
        self.sock.close()


def _served(env: str, forks: int) -> tuple[list[float], int, list[float]]:
    from turnpool.bench.servers import ServerProcess

    _, workers, _ = PLACES["served"]
    cmd = [sys.executable, "-m", "turnpool.cli", "serve", "--env", env, "--port", "0",
           "--max-sessions", "8", "--backend", "process", "--workers", str(workers)]
    server = ServerProcess("turnpool", 8, cmd=cmd)
    try:
        ws = BlockingWs(server.url)
        try:
            reset = ws.ask({"type": "reset", "data": {"seed": 1}})
            action = first_action(env, reset["data"]["observation"]["text"])
            if action is not None:
                ws.ask({"type": "step", "data": {"action": action}})
            snap = ws.ask({"type": "snapshot"})["data"]["snapshot"]
            size = len(json.dumps(snap, separators=(",", ":")))
            times = []
            for k in range(min(50, forks) + forks):  # a warm-up first
                t0 = time.perf_counter()
                fork = ws.ask({"type": "fork"})
                took = time.perf_counter() - t0
                if k >= min(50, forks):
                    times.append(took)
                ws.ask({"type": "mcp", "data": {
                    "jsonrpc": "2.0", "id": k, "method": "openenv/session/close",
                    "params": {"session_id": fork["data"]["session_id"]}}})
            restores = []
            for _ in range(forks):
                t0 = time.perf_counter()
                ws.ask({"type": "restore", "data": {"snapshot": snap}})
                restores.append(time.perf_counter() - t0)
        finally:
            ws.close()
    finally:
        server.close()
    return times, size, restores


@click.command("fork")
@click.option("--env", "envs", multiple=True, type=click.Choice(list(FIRST_ACTION)),
              help="Envs to measure (default: all four).")
@click.option("--place", "places", multiple=True, type=click.Choice(list(PLACES)),
              help="Places to measure (default: all four).")
@click.option("--forks", default=2000, show_default=True, help="Timed forks per row.")
@json_option("Write the rows as JSON here.")
def command(envs: tuple[str, ...], places: tuple[str, ...], forks: int,
            json_path: Path | None) -> None:
    """Fork latency p50/p99, forks/s and snapshot size: in-process, on process workers and
    through ``turnpool serve`` (there, restore p50 too)."""
    rows = [measure(env, place, forks) for env in envs or tuple(FIRST_ACTION)
            for place in places or tuple(PLACES)]
    click.echo(f"{'env':<12} {'place':<11} {'p50 µs':>9} {'p99 µs':>9} {'forks/s':>9} "
               f"{'snapshot B':>10} {'restore p50 µs':>14}")
    for r in rows:
        restore = "-" if r["restore_p50_us"] is None else f"{r['restore_p50_us']:.1f}"
        click.echo(f"{r['env']:<12} {r['place']:<11} {r['p50_us']:>9.1f} {r['p99_us']:>9.1f} "
                   f"{r['forks_per_s']:>9.0f} {r['snapshot_bytes']:>10} {restore:>14}")
    if json_path is not None:
        json_path.write_text(json.dumps({"machine": machine_info(), "rows": rows}, indent=1))
