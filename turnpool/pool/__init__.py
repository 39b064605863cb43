"""The pool: which env runs what, with which seed, and what happens when something fails.

``api.py`` (`EnvPool`) on ``replay.py`` (recovery) on ``dispatch.py`` (queues, deadlines);
``protocol.py`` (the messages, `TurnResult`) and ``host.py`` (`EnvHost`, inside every worker)
are shared with the backends. The names below are imported lazily so that a backend importing
``turnpool.pool.protocol`` or ``turnpool.pool.host`` does not import the `EnvPool` machinery
(which imports the backend registry): no import cycle.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY: dict[str, str] = {
    "EnvPool": "turnpool.pool.api",
    "EnvGroupSpec": "turnpool.pool.api",
    "EnvError": "turnpool.pool.api",
    "EnvConstructionError": "turnpool.pool.api",
    "TurnResult": "turnpool.pool.protocol",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'turnpool.pool' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
