"""One pool per configuration per process, shared by a trainer's many single-env users.

Trainers drive envs one trajectory at a time: TRL builds one environment object per rollout
and calls its tools in turn; verl runs one agent-loop coroutine per trajectory. They lease
slots of one `turnpool.pool.slots.SlotEngine` (any backend, so envs run in worker processes
with ``step_timeout`` enforced and faults isolated) instead of running env code in the
trainer's process with no timeout. `shared_leases` keeps one engine per configuration per
process (per trainer process, per verl agent-loop worker) and closes them all at exit.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

from turnpool.pool.slots import SlotEngine

log = logging.getLogger(__name__)

_SHARED: dict[tuple[int, str], SlotEngine] = {}
_SHARED_LOCK = threading.Lock()


def shared_leases(env_type: str, env_kwargs: Mapping[str, Any] | None = None,
                  capacity: int = 64, pool_options: Mapping[str, Any] | None = None
                  ) -> SlotEngine:
    """This process's `SlotEngine` for one configuration (created on first use, closed at
    exit). A forked child gets its own, never its parent's."""
    key = (os.getpid(), json.dumps([env_type, dict(env_kwargs or {}), int(capacity),
                                    dict(pool_options or {})], sort_keys=True, default=repr))
    with _SHARED_LOCK:
        leases = _SHARED.get(key)
        if leases is None:
            leases = SlotEngine(env_type, capacity=int(capacity),
                                env_kwargs=dict(env_kwargs or {}), **dict(pool_options or {}))
            _SHARED[key] = leases
        return leases


def close_shared() -> None:
    """Close every shared `SlotEngine` of this process (also run at interpreter exit)."""
    with _SHARED_LOCK:
        mine = [k for k in _SHARED if k[0] == os.getpid()]
        items = [_SHARED.pop(k) for k in mine]
    for leases in items:
        try:
            leases.close()
        except Exception as exc:  # noqa: BLE001 - exit must go on
            log.warning("closing env leases failed: %s", exc)


atexit.register(close_shared)
