"""The calls in flight of the ``/ws`` path (`turnpool.serve.ws`): a step's or reset's
waiter, which the slot engine's driver resolves straight into its connection, and the batch of
one event-loop pass's calls handed to the engine at once."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from turnpool.pool.slots import ResetSlotRequest, StepSlotRequest
from turnpool.serve.service import Service


class Answerer(Protocol):
    """What a call answers: the connection that made it (`turnpool.serve.ws.WsConnection`)."""

    loop: asyncio.AbstractEventLoop

    def stepped(self, result: Any, exc: BaseException | None) -> None: ...

    def was_reset(self, result: Any, exc: BaseException | None) -> None: ...


class StepCall:
    """One ``/ws`` step in flight: the slot engine's waiter for it (a `LoopWaiter`), which
    the driver's round resolves on the loop straight into `WsConnection.stepped`, with no
    future and no callback of its own (`ResetCall`: a reset, into
    `WsConnection.was_reset`). The session table's sweep fails a late one the same way
    (then the pool's answer, when it comes, finds it done)."""

    __slots__ = ("conn", "finished")

    def __init__(self, conn: Answerer) -> None:
        self.conn = conn
        self.finished = False

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self.conn.loop

    def done(self) -> bool:
        return self.finished

    def set_result(self, value: Any) -> None:
        if not self.finished:
            self.finished = True
            self.conn.stepped(value, None)

    def set_exception(self, exc: BaseException) -> None:
        if not self.finished:
            self.finished = True
            # the sweep fails calls while it walks the sessions: answer after it
            self.conn.loop.call_soon(self.answer, None, exc)

    def answer(self, value: Any, exc: BaseException | None) -> None:
        self.conn.stepped(value, exc)


class ResetCall(StepCall):
    """One ``/ws`` reset in flight (`StepCall`'s, answered by `WsConnection.was_reset`)."""

    __slots__ = ()

    def set_result(self, value: Any) -> None:
        if not self.finished:
            self.finished = True
            self.conn.was_reset(value, None)

    def answer(self, value: Any, exc: BaseException | None) -> None:
        self.conn.was_reset(value, exc)


class StepBatcher:
    """The steps and resets that sessions submit within one event-loop pass, handed to the
    slot engine as one inbox item at the end of it (one hand-off per pass, not per call)."""

    def __init__(self, service: Service) -> None:
        self.engine = service.engine
        self.items: list[StepSlotRequest | ResetSlotRequest] = []

    def add(self, request: StepSlotRequest | ResetSlotRequest, call: StepCall) -> StepCall:
        """``request`` (whose waiter is ``call``) goes with this pass's batch."""
        self.engine.check(request.slot)
        self.items.append(request)
        if len(self.items) == 1:
            call.conn.loop.call_soon(self.flush)
        return call

    def flush(self) -> None:
        items, self.items = self.items, []
        if items:
            self.engine.post(items)
