"""Routing between the fronts of one server: an HTTP or MCP request naming another front's
session (its id starts ``f<k>-``) is proxied to that front's private HTTP socket (`Router`,
`PeerClients`); ``/api/status`` and ``/metrics`` are gathered from every front
(`PeerClients.gather`, merged by `turnpool.serve.fronts.merge`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

from turnpool.serve.fronts.placement import owner_of
from turnpool.serve.jsonio import dumps_bytes
from turnpool.serve.verbs import VERBS

#: Paths whose requests may name a session of another front: every routed served verb's.
ROUTED_PATHS = frozenset("/" + verb.name for verb in VERBS if verb.routed)
#: Header a proxied request carries (the owner serves it, never routes it again) and the
#: header of its answer naming the front that proxied it.
ROUTED_HEADER = "x-turnpool-routed-by"


class PeerClients:
    """HTTP clients of the other fronts' private sockets (``path_of(k)``), made on first
    use and dropped when a front stops answering."""

    def __init__(self, index: int, count: int, path_of: Callable[[int], str],
                 timeout: float) -> None:
        self.index = index
        self.count = count
        self.path_of = path_of
        self.timeout = timeout
        self._clients: dict[int, Any] = {}

    def client(self, k: int) -> Any:
        import httpx

        client = self._clients.get(k)
        if client is None:
            client = httpx.AsyncClient(
                transport=httpx.AsyncHTTPTransport(uds=self.path_of(k)),
                base_url="http://front", timeout=self.timeout)
            self._clients[k] = client
        return client

    async def _drop(self, k: int) -> None:
        """Forget the client of front ``k`` (it died: the next call connects afresh)."""
        client = self._clients.pop(k, None)
        if client is not None:
            with contextlib.suppress(Exception):
                await client.aclose()

    async def proxy(self, k: int, scope: dict[str, Any], body: bytes) -> tuple[int, list[
            tuple[bytes, bytes]], bytes]:
        """Forward one HTTP request to front ``k``: (status, headers, body)."""
        headers = [(n, v) for n, v in scope["headers"]
                   if n.lower() not in (b"host", b"content-length", b"connection")]
        headers.append((ROUTED_HEADER.encode(), str(self.index).encode()))
        try:
            resp = await self.client(k).request(
                scope["method"], scope["path"], params=scope.get("query_string", b"").decode(
                    "latin-1"), headers=headers, content=body)
        except Exception as exc:  # the owner is gone or restarting
            await self._drop(k)
            return 502, [(b"content-type", b"application/json")], dumps_bytes(
                {"detail": {"code": "SESSION_ERROR", "retryable": True,
                            "message": f"the front holding this session did not answer: "
                                       f"{type(exc).__name__}"}})
        out = [(b"content-type", resp.headers.get("content-type", "application/json")
                .encode()), (ROUTED_HEADER.encode(), str(self.index).encode())]
        return resp.status_code, out, resp.content

    async def gather(self, path: str) -> list[tuple[int, Any]]:
        """``path?local=1`` from every other front: (front, response or None)."""
        async def one(k: int) -> tuple[int, Any]:
            try:
                resp = await self.client(k).get(path, params={"local": "1"}, timeout=5.0)
                return k, resp if resp.status_code == 200 else None
            except Exception:  # a front restarting is left out of this answer
                await self._drop(k)
                return k, None

        others = [k for k in range(self.count) if k != self.index]
        return list(await asyncio.gather(*(one(k) for k in others)))

    async def close(self) -> None:
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()


def session_of_request(scope: dict[str, Any], body: bytes) -> Any:
    """The session id an HTTP request names (query ``session_id``, or the JSON body's
    ``session_id`` / ``params.session_id``); None when it names none."""
    query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
    if query.get("session_id"):
        return query["session_id"]
    if not body or b"session_id" not in body:
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    params = data.get("params")
    if data.get("session_id") is None and isinstance(params, dict):
        return params.get("session_id")
    return data.get("session_id")


class Router:
    """ASGI middleware of a front: a request naming another front's session goes there."""

    def __init__(self, app: Any, peers: PeerClients, max_body: int) -> None:
        self.app = app
        self.peers = peers
        self.max_body = max_body

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] != "http" or scope["path"] not in ROUTED_PATHS or any(
                n == ROUTED_HEADER.encode() for n, _ in scope["headers"]):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size, more = 0, True
        while more and size <= self.max_body:
            msg = await receive()
            if msg["type"] != "http.request":
                return
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            more = msg.get("more_body", False)
        body = b"".join(chunks)
        owner = owner_of(session_of_request(scope, body)) if not more else None
        if owner is None or owner == self.peers.index or owner >= self.peers.count:
            await self.app(scope, _replay(body, more, receive), send)
            return
        status, headers, content = await self.peers.proxy(owner, scope, body)
        headers.append((b"content-length", str(len(content)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})


def _replay(body: bytes, more: bool, receive: Callable[[], Awaitable[Any]]
            ) -> Callable[[], Awaitable[Any]]:
    """``receive`` that gives ``body`` first (then the rest, if there is more)."""
    first = True

    async def again() -> Any:
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": body, "more_body": more}
        return await receive()

    return again


__all__ = ["ROUTED_HEADER", "ROUTED_PATHS", "PeerClients", "Router", "session_of_request"]
