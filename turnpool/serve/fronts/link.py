"""A front's side of its group, put together from the parts: its load published on the
board (`turnpool.serve.fronts.placement`), new sessions placed, connections passed and
received (`turnpool.serve.fronts.passing`), requests routed and answers gathered
(`turnpool.serve.fronts.routing`, `turnpool.serve.fronts.merge`). It is what
`turnpool.serve.running.FrontPeers` names; it holds no reference to the server: the engine,
its own paths and the way to adopt a passed connection are given to it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from turnpool.serve.engine import PoolEngine
from turnpool.serve.fronts.merge import merge_metrics, merge_status
from turnpool.serve.fronts.passing import Adopt, SocketPasser
from turnpool.serve.fronts.placement import LoadBoard, Placer
from turnpool.serve.fronts.routing import PeerClients, Router
from turnpool.serve.fronts.spec import FrontSpec
from turnpool.serve.service import MAX_MESSAGE_CHARS

#: Seconds between two publications of a front's load.
PUBLISH_PERIOD_S = 0.1


class FrontLink:
    """Front ``spec.index``'s link to the others over ``engine``'s load; ``on_ready`` is
    called once it publishes and receives."""

    def __init__(self, spec: FrontSpec, engine: PoolEngine,
                 on_ready: Callable[[], None] | None = None) -> None:
        self.index, self.count = spec.index, spec.count
        self.engine = engine
        #: what this front's session ids start with (`owner_of` reads it back)
        self.prefix = f"f{spec.index}-"
        self._on_ready = on_ready
        self.board = LoadBoard(spec.directory, spec.index, spec.count)
        self.placer = Placer(spec.index, spec.count)
        self.passer = SocketPasser(spec.fd_path(spec.index), spec.fd_path)
        self.peers = PeerClients(spec.index, spec.count, spec.http_path,
                                 spec.settings.call_timeout_s())
        self._publisher: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifecycle
    def serve_passed_with(self, adopt: Adopt) -> None:
        """How to serve a connection another front passed here (set before `start`)."""
        self.passer.adopt = adopt

    def install(self, app: Any) -> None:
        """Put this front's `Router` in front of ``app``."""
        app.add_middleware(Router, peers=self.peers, max_body=MAX_MESSAGE_CHARS)

    async def start(self) -> None:
        """Begin publishing and receiving connections (in the app's lifespan)."""
        self.passer.start()
        self.publish()
        self._publisher = asyncio.create_task(self._publish_forever())
        if self._on_ready is not None:
            self._on_ready()

    async def stop(self) -> None:
        if self._publisher is not None:
            self._publisher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._publisher
        self.passer.stop()
        await self.peers.close()
        self.board.close()

    # ------------------------------------------------------------------ loads
    def publish(self) -> None:
        cost, measured, leased = self.engine.measured_load()
        self.board.publish(cost, measured, leased, self.engine.capacity - leased)

    def publish_count(self) -> None:
        """Publish this front's sessions and free slots now (a session opened or closed):
        a burst of new connections must not all be passed to a front that just filled."""
        leased = self.engine.leased
        self.board.publish_counts(leased, self.engine.capacity - leased)

    async def _publish_forever(self) -> None:
        while True:
            await asyncio.sleep(PUBLISH_PERIOD_S)
            self.publish()

    # ------------------------------------------------------------------ placement
    def place(self, session_id: str | None, hops: int = 0) -> int | None:
        """The front a new ``/ws`` connection should go to (None: this one), `Placer`."""
        return self.placer.place(session_id, hops, self.board.rows(), self.engine.leased,
                                 self.engine.capacity)

    def pass_connection(self, transport: asyncio.Transport, data: bytes, to: int,
                        hops: int = 1, here: Callable[[], None] | None = None) -> bool:
        return self.passer.pass_connection(transport, data, to, hops, here)

    # ------------------------------------------------------------------ one answer
    def local_status(self) -> dict[str, Any]:
        """What this front adds to its own ``/api/status``."""
        return {"placement": self.board.published(), "passed_out": self.passer.passed_out,
                "passed_in": self.passer.passed_in}

    async def merged_status(self, local: dict[str, Any]) -> dict[str, Any]:
        parts = {self.index: local}
        for k, resp in await self.peers.gather("/api/status"):
            if resp is not None:
                parts[k] = resp.json()
        return merge_status(parts, self.count)

    async def merged_metrics(self, local: bytes) -> bytes:
        texts = {self.index: local.decode()}
        for k, resp in await self.peers.gather("/metrics"):
            if resp is not None:
                texts[k] = resp.text
        return merge_metrics(texts)


__all__ = ["PUBLISH_PERIOD_S", "FrontLink"]
