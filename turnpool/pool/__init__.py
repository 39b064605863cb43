"""The pool: which env runs what, with which seed, and what happens when something fails.

``api.py`` (`EnvPool`: groups, seeds, public calls) holds a ``dispatch.py`` `Dispatcher`
(queues, deadlines, carrying out recovery) which owns a ``table.py`` `EnvTable` (every env's
owner, episode and status, with a ``replay.py`` `ReplayLog`); ``requests.py`` builds the
per-worker requests and ``recovery.py`` decides whom a lost worker's fault blames;
``slots.py`` leases single-env slots of one pool to many independent users. The pool stands
on the backends, which stand on the worker floor (``turnpool/worker/``).
"""

from __future__ import annotations

from turnpool.pool.api import EnvConstructionError, EnvError, EnvGroupSpec, EnvPool
from turnpool.pool.branch import Snapshot
from turnpool.worker.results import TurnResult

__all__ = ["EnvConstructionError", "EnvError", "EnvGroupSpec", "EnvPool", "Snapshot", "TurnResult"]
