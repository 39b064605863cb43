"""The pool: which env runs what, with which seed, and what happens when something fails.

``api.py`` (`EnvPool`: groups, seeds, public calls) holds a ``dispatch.py`` `Dispatcher`
(queues, deadlines, recovery) which holds a ``replay.py`` `ReplayLog`; ``slots.py`` leases
single-env slots of one pool to many independent users. The pool stands on the backends,
which stand on the worker floor (``turnpool/worker/``).
"""

from __future__ import annotations

from turnpool.pool.api import EnvConstructionError, EnvError, EnvGroupSpec, EnvPool
from turnpool.worker.protocol import TurnResult

__all__ = ["EnvConstructionError", "EnvError", "EnvGroupSpec", "EnvPool", "TurnResult"]
