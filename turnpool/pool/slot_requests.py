"""What `turnpool.pool.slots.SlotEngine`'s driver takes and talks to: typed request records
(one per call, each with the future to resolve), the `SlotPool` it drives (an `EnvPool`, or a
fake in unit tests) and the delivery of results to blocking and asyncio callers.

Example:
    >>> import concurrent.futures
    >>> fut = concurrent.futures.Future()
    >>> StepSlotRequest(slot=3, actions=["up"], waiter=fut).slot
    3
    >>> deliver([(fut, "done", None)]); fut.result()
    'done'
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from turnpool.pool.api import EnvPool
from turnpool.pool.branch import Snapshot


class LoopWaiter(Protocol):
    """A waiter resolved on its event loop without being a future (`turnpool.serve.ws`'s
    step calls): ``set_result`` / ``set_exception`` run there, in the one callback per loop
    per round, and must not raise."""

    def get_loop(self) -> asyncio.AbstractEventLoop: ...

    def done(self) -> bool: ...

    def set_result(self, value: Any) -> None: ...

    def set_exception(self, exc: BaseException) -> None: ...


#: What the driver resolves: `concurrent.futures.Future` (blocking face), `asyncio.Future`
#: (asyncio face) or a `LoopWaiter`.
Waiter = concurrent.futures.Future[Any] | asyncio.Future[Any] | LoopWaiter
Deliveries = list[tuple[Waiter, Any, BaseException | None]]


class PoolFull(RuntimeError):
    """Every slot is leased (a server answers "busy"; a trainer raises its capacity)."""


class PoolTimeout(RuntimeError):
    """The pool did not answer a call within the caller's timeout (the slot is retired)."""


class SlotReset(NamedTuple):
    """A slot's reset: its first observation and info, the seed it used, or the failure."""

    obs: str
    info: dict[str, Any]
    seed: int | None
    error: str | None
    failure: str | None


class OneSlot:
    """A slot request about one slot (`slots` is what the engine checks and marks busy)."""

    __slots__ = ()
    slot: int

    @property
    def slots(self) -> tuple[int, ...]:
        return (self.slot,)


# The two records of a served step and reset are not frozen: a frozen dataclass's
# ``__init__`` sets each field through ``object.__setattr__`` (0.64 µs against 0.15 here),
# once per served step. Nobody changes them after they are made either way.
@dataclass(slots=True)
class StepSlotRequest(OneSlot):
    """Run ``actions`` in ``slot``; ``waiter`` gets its `TurnResult`."""

    slot: int
    actions: list[Any]
    waiter: Waiter


@dataclass(slots=True)
class ResetSlotRequest(OneSlot):
    """Start an episode in ``slot`` from ``seed`` (None: the pool's schedule); ``waiter``
    gets its `SlotReset`."""

    slot: int
    seed: int | None
    waiter: Waiter


@dataclass(frozen=True, slots=True)
class ReleaseRequest:
    """``slot`` was released: its episode is over for the pool too (no answer)."""

    slot: int


class Branched(NamedTuple):
    """A slot put into a snapshot's state (a restore, or a fork's destination): its current
    observation and info, and the snapshot it now plays (its ``seed`` and ``turns``)."""

    obs: str
    info: dict[str, Any]
    snapshot: Snapshot


@dataclass(frozen=True, slots=True)
class SnapshotSlotRequest(OneSlot):
    """``slot``'s episode as a `Snapshot` restored by replay (`EnvPool.episode`: the pool's
    record, no worker call; the caller knows the episode is not over); ``waiter`` gets it."""

    slot: int
    waiter: Waiter

    def run(self, pool: SlotPool) -> Snapshot:
        return pool.episode(self.slot)


@dataclass(frozen=True, slots=True)
class RestoreSlotRequest(OneSlot):
    """Put ``slot``'s env into ``snapshot``'s state; ``waiter`` gets a `Branched`."""

    slot: int
    snapshot: Snapshot
    waiter: Waiter

    def run(self, pool: SlotPool) -> Branched:
        obs, infos = pool.restore([self.slot], [self.snapshot])
        return Branched(obs[0], infos[0], self.snapshot)


@dataclass(frozen=True, slots=True)
class ForkSlotRequest:
    """Copy ``slot``'s env mid-episode into slot ``dst`` (which continues exactly as
    ``slot`` would: `EnvPool.fork`, one worker message when both are on one worker);
    ``waiter`` gets ``dst``'s `Branched`."""

    slot: int
    dst: int
    waiter: Waiter

    @property
    def slots(self) -> tuple[int, ...]:
        return (self.slot, self.dst)

    def run(self, pool: SlotPool) -> Branched:
        obs, infos = pool.fork(self.slot, [self.dst])
        return Branched(obs[0], infos[0], pool.episode(self.dst))


#: A branching call: run by the driver between its rounds' sends and its poll (it blocks
#: the driver for that call; other slots' turns in flight go on meanwhile).
BranchRequest = SnapshotSlotRequest | RestoreSlotRequest | ForkSlotRequest
SlotRequest = StepSlotRequest | ResetSlotRequest | ReleaseRequest | BranchRequest


class SlotPool(Protocol):
    """What the driver uses of `EnvPool` (a fake one drives it in unit tests)."""

    @property
    def num_envs(self) -> int: ...

    @property
    def env_seeds(self) -> list[int | None]: ...

    @property
    def worker_slices(self) -> list[list[int]]: ...

    def owner_of(self, env_id: int) -> int: ...

    @property
    def backend_name(self) -> str: ...

    def worker_nodes(self) -> list[str | None]: ...

    def step_async(self, env_ids: list[int], action_lists: list[Any]) -> None: ...

    def reset_async(self, seed: int | dict[int, int] | None, env_ids: list[int]) -> None: ...

    def poll(self, timeout: float, min_ready: int) -> list[tuple[int, Any]]: ...

    def wait_fds(self) -> tuple[list[int], bool] | None: ...

    def forget(self, env_ids: list[int]) -> None: ...

    def episode(self, env_id: int) -> Snapshot: ...

    def restore(self, env_ids: list[int], snapshots: list[Snapshot]
                ) -> tuple[list[str], list[dict[str, Any]]]: ...

    def fork(self, src_id: int, dst_ids: list[int]
             ) -> tuple[list[str], list[dict[str, Any]]]: ...

    def close(self) -> None: ...


class EnvPoolSlots:
    """`SlotPool` over an `EnvPool` (its worker slices read from its backend)."""

    def __init__(self, pool: EnvPool) -> None:
        self.pool = pool
        self.num_envs = pool.num_envs

    @property
    def env_seeds(self) -> list[int | None]:
        return self.pool.env_seeds

    @property
    def worker_slices(self) -> list[list[int]]:
        return [list(ids) for ids in self.pool.backend.slices]

    def owner_of(self, env_id: int) -> int:
        return self.pool.owner_of(env_id)

    @property
    def backend_name(self) -> str:
        return self.pool.backend_name

    def worker_nodes(self) -> list[str | None]:
        return self.pool.backend.worker_nodes()

    def step_async(self, env_ids: list[int], action_lists: list[Any]) -> None:
        self.pool.step_async(env_ids, action_lists)

    def reset_async(self, seed: int | dict[int, int] | None, env_ids: list[int]) -> None:
        self.pool.reset_async(seed=seed, env_ids=env_ids)  # slot = group: group_n is 1

    def poll(self, timeout: float, min_ready: int) -> list[tuple[int, Any]]:
        return self.pool.poll(timeout=timeout, min_ready=min_ready)

    def wait_fds(self) -> tuple[list[int], bool] | None:
        return self.pool.wait_fds()

    def forget(self, env_ids: list[int]) -> None:
        self.pool.forget(env_ids)

    def episode(self, env_id: int) -> Snapshot:
        return self.pool.episode(env_id)

    def restore(self, env_ids: list[int], snapshots: list[Snapshot]
                ) -> tuple[list[str], list[dict[str, Any]]]:
        return self.pool.restore(env_ids, snapshots)

    def fork(self, src_id: int, dst_ids: list[int]
             ) -> tuple[list[str], list[dict[str, Any]]]:
        return self.pool.fork(src_id, dst_ids)

    def close(self) -> None:
        self.pool.close()


def deliver(out: Deliveries) -> None:
    """Resolve the waiters: concurrent futures directly, the others (asyncio futures and
    `LoopWaiter`s) in one thread-safe callback per event loop."""
    by_loop: dict[asyncio.AbstractEventLoop, Deliveries] = {}
    for item in out:
        waiter = item[0]
        if isinstance(waiter, concurrent.futures.Future):
            resolve([item])
        else:
            by_loop.setdefault(waiter.get_loop(), []).append(item)
    for loop, items in by_loop.items():
        if loop.is_closed():
            continue
        try:
            loop.call_soon_threadsafe(resolve, items)
        except RuntimeError:  # the loop closed meanwhile
            pass


def resolve(out: Deliveries) -> None:
    for waiter, value, exc in out:
        # no ``done()`` first (a call per result): a waiter whose caller went away
        # (cancelled, timed out) while its call ran refuses the value, and a `LoopWaiter`
        # ignores it
        try:
            if exc is not None:
                waiter.set_exception(exc)
            else:
                waiter.set_result(value)
        except (concurrent.futures.InvalidStateError, asyncio.InvalidStateError):
            pass


__all__ = ["BranchRequest", "Branched", "Deliveries", "EnvPoolSlots", "ForkSlotRequest",
           "LoopWaiter", "PoolFull", "PoolTimeout", "ReleaseRequest", "ResetSlotRequest",
           "RestoreSlotRequest",
           "SlotPool", "SlotRequest", "SlotReset", "SnapshotSlotRequest", "StepSlotRequest",
           "Waiter", "deliver", "resolve"]
