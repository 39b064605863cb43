"""The load client of ``turnpool bench serve-soak`` (`turnpool.bench.serve_soak`), run in a
process of its own: ``python -m turnpool.bench.soak_client URL SETTINGS_JSON``.

It holds ``sessions`` WebSocket sessions, each a `_Session` driven by `_Load.session`: connect,
reset, then every ``think`` seconds a normal step or a fault; a ``sample`` JSON line per
interval goes to stdout, and a ``result`` line with the totals at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from turnpool.bench.serve_soak import ACCEPTED, Settings
from turnpool.bench.ws_client import WsClient, _raise_fd_limit

#: how many lost sessions / unexpected replies the report keeps in detail
_DETAIL = 20


class _Lost(Exception):
    """No reply within the bound, or the connection closed under the session."""


class _Stats:
    """Counters of one sample interval (and, merged, of the whole run)."""

    def __init__(self) -> None:
        self.c: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self.classified: Counter[str] = Counter()  # "hang->timeout"
        self.replies: Counter[str] = Counter()  # "observation", "error:timeout", ...
        self.unexpected: Counter[str] = Counter()  # normal steps answered with an error
        self.lost: Counter[str] = Counter()  # reason -> n
        self.lat: list[float] = []

    def as_dict(self) -> dict[str, Any]:
        lat = sorted(self.lat)
        return {"steps": self.c["steps"], "normal_steps": self.c["normal_steps"],
                "resets": self.c["resets"], "reset_errors": self.c["reset_errors"],
                "reconnects": self.c["reconnects"], "refused": self.c["refused"],
                "misclassified": self.c["misclassified"], "lost": sum(self.lost.values()),
                "lost_by": dict(self.lost), "faults": dict(self.faults),
                "classified": dict(self.classified), "replies": dict(self.replies),
                "unexpected_errors": dict(self.unexpected),
                "p50_ms": _pct(lat, 0.50), "p99_ms": _pct(lat, 0.99),
                "max_ms": lat[-1] * 1000 if lat else None}


def _pct(lat: list[float], q: float) -> float | None:
    return lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else None


def _kind(reply: str) -> tuple[str, dict[str, Any]]:
    """``("observation", {})`` or ``("error:<failure or code>", data)``."""
    if reply.startswith('{"type":"observation"'):
        return "observation", {}
    try:
        msg = json.loads(reply)
        data = msg.get("data") or {}
    except (ValueError, AttributeError):
        return "unparsable", {}
    if msg.get("type") != "error":
        return str(msg.get("type")), data
    return f"error:{data.get('failure') or data.get('code')}", data


@dataclass
class _Session:
    """One client session's own state."""

    i: int
    rng: random.Random
    ws: WsClient | None = None
    needs_reset: bool = True
    first: bool = True
    episode: int = 0
    #: what the request in flight is: connect, reset, step or a fault's name
    asking: str = "connect"


class _Load:
    """``s.sessions`` sessions for ``s.seconds``, their counters and the sampling loop."""

    def __init__(self, url: str, s: Settings) -> None:
        self.url, self.s = url, s
        self.gate = asyncio.Semaphore(s.connect_parallel)
        self.started, self.stop = asyncio.Event(), asyncio.Event()
        self.interval, self.total = _Stats(), _Stats()
        self.churn: set[int] = set()
        self.opened = 0  # sessions that reset once (the start waits for all)
        self.open_now = 0
        self.details: list[dict[str, Any]] = []
        self.t_start = 0.0

    # ---------------------------------------------------------------- counting
    def both(self) -> tuple[_Stats, _Stats]:
        return self.interval, self.total

    def count(self, key: str, n: int = 1) -> None:
        for st in self.both():
            st.c[key] += n

    def note(self, what: str, i: int, **extra: Any) -> None:
        if len(self.details) < _DETAIL:
            t_s = round(time.monotonic() - self.t_start, 1) if self.t_start else None
            self.details.append({"t_s": t_s, "what": what, "session": i, **extra})

    async def pause(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)

    async def ask(self, ws: WsClient, text: str) -> str:
        try:
            return await asyncio.wait_for(ws.ask(text), self.s.reply_bound)
        except asyncio.TimeoutError as exc:
            raise _Lost("no_reply") from exc
        except (ConnectionError, asyncio.IncompleteReadError, OSError) as exc:
            raise _Lost("closed") from exc

    # ---------------------------------------------------------------- one session
    async def session(self, i: int) -> None:
        me = _Session(i, random.Random(self.s.seed + i))
        while not self.stop.is_set():
            try:
                await self._turn(me)
            except _Lost as exc:
                reason = f"{exc}:{me.asking}"  # e.g. no_reply:hang
                for st in self.both():
                    st.lost[reason] += 1
                self.note("lost", i, reason=reason)
                await self._drop(me)
        await self._drop(me)

    async def _drop(self, me: _Session) -> None:
        if me.ws is not None:
            await me.ws.close()
            me.ws = None
            self.open_now -= 1

    async def _turn(self, me: _Session) -> None:
        """Connect, reset or step once, as the session needs next."""
        ws = me.ws
        if ws is None:
            ws = await self._connect(me)
            if ws is None:
                return
        if me.needs_reset and not await self._reset(me, ws):
            return
        await self.pause(self.s.think)
        if self.stop.is_set():
            return
        if me.i in self.churn:
            self.churn.discard(me.i)
            self.count("reconnects")
            await self._drop(me)
            return
        await self._step(me, ws)

    async def _connect(self, me: _Session) -> WsClient | None:
        try:
            async with self.gate:
                me.ws = await asyncio.wait_for(WsClient.connect(self.url), self.s.reply_bound)
        except Exception as exc:
            self.count("refused")
            self.note("connect failed", me.i, error=repr(exc)[:200])
            await self.pause(1.0)
            return None
        self.open_now += 1
        me.needs_reset = True
        return me.ws

    async def _reset(self, me: _Session, ws: WsClient) -> bool:
        """Reset; whether the session goes on to step in this turn."""
        s = self.s
        me.episode += 1
        me.asking = "reset"
        reply = await self.ask(ws, json.dumps(
            {"type": "reset", "data": {"seed": (s.seed + me.i) * 1000 + me.episode}}))
        kind, data = _kind(reply)
        self.count("resets")
        if kind != "observation":
            self.count("reset_errors")
            self.note("reset error", me.i, reply=kind, message=str(data.get("message"))[:200])
            if data.get("code") == "CAPACITY_REACHED":  # closed by the server
                self.count("refused")
                await self._drop(me)
            await self.pause(1.0)
            return False
        me.needs_reset = False
        if me.first:
            me.first = False
            self.opened += 1
            await self.started.wait()
            await self.pause(s.think * me.i / s.sessions)
            return False
        return True

    async def _step(self, me: _Session, ws: WsClient) -> None:
        s = self.s
        fault = None
        if me.rng.random() < s.fault_rate:
            fault = me.rng.choice(s.faults)
        action = fault or f"a{me.rng.randrange(10)}"
        me.asking = fault or "step"
        if fault is not None:  # counted when sent: a lost one was injected too
            for st in self.both():
                st.faults[fault] += 1
        t0 = time.perf_counter()
        reply = await self.ask(ws, json.dumps({"type": "step", "data": {"action": action}}))
        took = time.perf_counter() - t0
        kind, data = _kind(reply)
        self.count("steps")
        for st in self.both():
            st.replies[kind] += 1
        if fault is not None:
            got = str(data.get("failure"))
            for st in self.both():
                st.classified[f"{fault}->{got}"] += 1
            if got not in ACCEPTED[fault]:
                self.count("misclassified")
                self.note("misclassified", me.i, fault=fault, reply=kind,
                          message=str(data.get("message"))[:200])
            me.needs_reset = True
            return
        self.count("normal_steps")
        if kind != "observation":
            for st in self.both():
                st.unexpected[kind] += 1
            self.note("normal step answered with an error", me.i, reply=kind,
                      message=str(data.get("message"))[:200])
            me.needs_reset = True
            return
        for st in self.both():
            st.lat.append(took)
        if '"done":true' in reply:
            me.needs_reset = True

    # ---------------------------------------------------------------- the run
    async def run(self) -> dict[str, Any]:
        """Open every session, sample until ``s.seconds`` have passed, return the totals."""
        s = self.s
        tasks = [asyncio.create_task(self.session(i)) for i in range(s.sessions)]
        deadline = time.monotonic() + 600
        while self.opened < s.sessions and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self.t_start = time.monotonic()
        open_s = None if self.opened < s.sessions else self.t_start - (deadline - 600)
        print(json.dumps({"started": self.opened, "open_s": open_s}), flush=True)
        self.started.set()
        await self._sample()
        self.stop.set()
        _, pending = await asyncio.wait(tasks, timeout=s.reply_bound + 10)
        for task in pending:
            task.cancel()
        out = self.total.as_dict()
        # steps in flight at the last sample finish after it: counted in the totals and here
        out.update(sessions=s.sessions, started=self.opened, open_s=open_s,
                   ended_unfinished=len(pending), after_last_sample=self.interval.as_dict(),
                   details=self.details)
        return out

    async def _sample(self) -> None:
        """Print a ``sample`` line every ``s.sample_every`` s and pick the sessions that
        reconnect every ``s.reconnect_every`` s, until ``s.seconds`` have passed."""
        s, t_start = self.s, self.t_start
        churn_rng = random.Random(s.seed)
        next_churn = s.reconnect_every
        samples = 0
        end = t_start + s.seconds
        while time.monotonic() < end:
            wake = min(t_start + (samples + 1) * s.sample_every, end)
            if s.reconnect_every > 0:
                wake = min(wake, t_start + next_churn)
            await asyncio.sleep(max(0.0, wake - time.monotonic()))
            now = time.monotonic() - t_start
            if s.reconnect_every > 0 and now >= next_churn - 1e-6:
                self.churn.update(churn_rng.sample(range(s.sessions), max(1, s.sessions // 100)))
                next_churn += s.reconnect_every
            if now >= (samples + 1) * s.sample_every - 1e-6 or time.monotonic() >= end:
                samples += 1
                out = {"t_s": round(now, 2), "sessions_open": self.open_now,
                       **self.interval.as_dict()}
                self.interval = _Stats()
                print("sample " + json.dumps(out), flush=True)


async def _load(url: str, s: Settings) -> dict[str, Any]:
    """Drive ``s.sessions`` sessions for ``s.seconds``; print a ``sample`` line per interval
    and return the totals."""
    return await _Load(url, s).run()


def main(argv: list[str]) -> None:
    """``URL SETTINGS_JSON``: run the load, print its ``result`` line."""
    _raise_fd_limit()
    given = json.loads(argv[1])
    url, s = argv[0], Settings(**{**given, "faults": tuple(given["faults"])})
    result = asyncio.run(_load(url, s))
    print("result " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
