"""One EnvPool shared by many single-env users: lease a slot, reset it, step it, give it back.

Trainers drive envs one trajectory at a time: TRL builds one environment object per rollout
and calls its tools in turn; verl runs one agent-loop coroutine per trajectory. `EnvLeases`
lets all of them share one `turnpool.pool.EnvPool` (any backend, so envs run in worker
processes with ``step_timeout`` enforced and faults isolated) instead of running env code in
the trainer's process with no timeout.

The pool is not thread-safe, so one driver thread owns it. Callers, from any thread or event
loop, submit requests and get a `concurrent.futures.Future`; the driver takes everything that
is queued and sends all step requests of that round as one ``pool.step_turns`` call, so
trajectories that step at the same time are stepped in parallel by the pool's workers.
Resets are sent one per request (each slot gets its own seed). Slots are groups of one
(``group_n=1``), so slot ``i`` reset with ``base = seed - i`` starts from ``seed``.

`shared_leases` keeps one `EnvLeases` per configuration per process (per trainer process, per
verl agent-loop worker) and closes them all at interpreter exit.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from turnpool.pool import EnvPool, TurnResult

log = logging.getLogger(__name__)

#: How long the driver waits for work before checking whether it was closed.
_IDLE_WAIT_S = 0.5


@dataclass
class _Request:
    kind: str  # "reset" | "step"
    env_id: int
    seed: int = 0
    actions: list[Any] = field(default_factory=list)
    future: Future[Any] = field(default_factory=Future)


class EnvLeases:
    """``capacity`` env slots of one env type on one pool, leased one at a time.

    Example:
        >>> leases = EnvLeases("bandit", capacity=2, pool_options={"backend": "sequential"})
        >>> slot = leases.lease()
        >>> obs, info = leases.reset(slot, seed=3).result(timeout=30)
        >>> leases.step(slot, ["dragon"]).result(timeout=30).terminated
        True
        >>> leases.release(slot); leases.close()
    """

    def __init__(self, env_type: str, env_kwargs: Mapping[str, Any] | None = None,
                 capacity: int = 64, pool_options: Mapping[str, Any] | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.env_type = env_type
        self.env_kwargs = dict(env_kwargs or {})
        self.capacity = int(capacity)
        self.pool = EnvPool(env_type, env_num=self.capacity, group_n=1,
                            env_kwargs=self.env_kwargs, **dict(pool_options or {}))
        self._free = list(range(self.capacity - 1, -1, -1))
        self._leased: set[int] = set()
        self._lock = threading.Lock()
        self._queue: queue.Queue[_Request] = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="turnpool-leases", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ slots
    def lease(self) -> int:
        """A free slot's env id; ``RuntimeError`` when all ``capacity`` slots are leased."""
        with self._lock:
            if self._closed:
                raise RuntimeError("env leases are closed")
            if not self._free:
                raise RuntimeError(f"all {self.capacity} env slots of {self.env_type!r} are "
                                   f"leased; raise capacity")
            env_id = self._free.pop()
            self._leased.add(env_id)
            return env_id

    def release(self, env_id: int) -> None:
        """Give a slot back (idempotent)."""
        with self._lock:
            if env_id in self._leased:
                self._leased.discard(env_id)
                self._free.append(env_id)

    @property
    def leased(self) -> int:
        """How many slots are leased now."""
        with self._lock:
            return len(self._leased)

    # ------------------------------------------------------------------ env calls
    def reset(self, env_id: int, seed: int) -> Future[tuple[str, dict[str, Any]]]:
        """Start an episode in slot ``env_id`` from ``seed``; the future gives ``(obs, info)``
        (``info["error"]`` set when the env could not be reset)."""
        return self._submit(_Request("reset", int(env_id), seed=int(seed)))

    def step(self, env_id: int, actions: Sequence[Any]) -> Future[TurnResult]:
        """Run ``actions`` in slot ``env_id`` (stopping at the first done); the future gives
        the `turnpool.pool.TurnResult` (a hang is cut at the pool's ``step_timeout``)."""
        return self._submit(_Request("step", int(env_id), actions=list(actions)))

    def _submit(self, req: _Request) -> Future[Any]:
        with self._lock:
            if self._closed:
                raise RuntimeError("env leases are closed")
            if req.env_id not in self._leased:
                raise ValueError(f"env slot {req.env_id} is not leased")
        self._queue.put(req)
        return req.future

    # ------------------------------------------------------------------ driver
    def _serve(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=_IDLE_WAIT_S)
            except queue.Empty:
                if self._closed:
                    return
                continue
            batch = [first]
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if self._closed:
                for req in batch:
                    req.future.set_exception(RuntimeError("env leases are closed"))
                continue
            self._run(batch)

    def _run(self, batch: list[_Request]) -> None:
        steps = [r for r in batch if r.kind == "step"]
        for req in batch:
            if req.kind == "reset":
                try:
                    obs, infos = self.pool.reset(seed=req.seed - req.env_id, env_ids=[req.env_id])
                    req.future.set_result((obs[0], infos[0]))
                except Exception as exc:  # noqa: BLE001 - handed to the caller
                    req.future.set_exception(exc)
        if not steps:
            return
        try:
            results = self.pool.step_turns([r.actions for r in steps], [r.env_id for r in steps])
        except Exception as exc:  # noqa: BLE001 - handed to every caller of the round
            for req in steps:
                req.future.set_exception(exc)
            return
        for req, res in zip(steps, results):
            req.future.set_result(res)

    def close(self) -> None:
        """Stop the driver and close the pool. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._thread.join(timeout=_IDLE_WAIT_S * 4 + 60.0)
        self.pool.close()

    def __enter__(self) -> EnvLeases:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_SHARED: dict[tuple[int, str], EnvLeases] = {}
_SHARED_LOCK = threading.Lock()


def shared_leases(env_type: str, env_kwargs: Mapping[str, Any] | None = None,
                  capacity: int = 64, pool_options: Mapping[str, Any] | None = None
                  ) -> EnvLeases:
    """This process's `EnvLeases` for one configuration (created on first use, closed at
    exit). A forked child gets its own, never its parent's."""
    key = (os.getpid(), json.dumps([env_type, dict(env_kwargs or {}), int(capacity),
                                    dict(pool_options or {})], sort_keys=True, default=repr))
    with _SHARED_LOCK:
        leases = _SHARED.get(key)
        if leases is None:
            leases = EnvLeases(env_type, env_kwargs, capacity, pool_options)
            _SHARED[key] = leases
        return leases


def close_shared() -> None:
    """Close every shared `EnvLeases` of this process (also run at interpreter exit)."""
    with _SHARED_LOCK:
        mine = [k for k in _SHARED if k[0] == os.getpid()]
        items = [_SHARED.pop(k) for k in mine]
    for leases in items:
        try:
            leases.close()
        except Exception as exc:  # noqa: BLE001 - exit must go on
            log.warning("closing env leases failed: %s", exc)


atexit.register(close_shared)
