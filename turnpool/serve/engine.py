"""The pool side of ``turnpool serve``: its settings, and the slot engine built from them.

Sessions lease slots of one `turnpool.pool.slots.SlotEngine` (an `EnvPool` of single-env
groups on its own driver thread, steps of all sessions batched into one pool call, results
ready-first); `turnpool.serve.service` speaks the protocol over it. `PoolEngine` only adds
the settings.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from turnpool.pool.slots import PoolFull, PoolTimeout, SlotEngine, SlotReset
from turnpool.worker.defaults import DEFAULT_STEP_TIMEOUT
from turnpool.worker.failures import FAILURE_CLASSES

#: OpenEnv's server modes (`ServeSettings.mode`)
SERVE_MODES = ("simulation", "production")


@dataclass
class ServeSettings:
    """What a ``turnpool serve`` runs. Every field is also a CLI option / config key."""

    env: str = "sokoban"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    #: ``process`` by default: a server must be able to stop any hang, which only a worker
    #: process can (`turnpool.worker.deadline`); ``auto`` may run cheap envs in-process
    backend: str = "process"
    num_workers: int | None = None
    #: env slots in the pool = the most sessions held at once (more get a "busy" answer)
    max_sessions: int = 256
    #: seconds one env may spend on one turn: past it the turn fails with ``timeout`` (the
    #: worker's hand-off answers for the stuck env and keeps serving the others; only a
    #: worker that cannot answer at all is replaced) and the session's episode is over
    step_timeout: float = DEFAULT_STEP_TIMEOUT
    reset_timeout: float | None = None
    #: seconds a WebSocket session may stay idle before the server closes it (telling the
    #: client) and frees its slot; None: never (OpenEnv never closes one, and a slow policy
    #: must not lose its episode)
    session_timeout: float | None = None
    #: sessions held over HTTP (``/reset`` with ``"stateful": true``) or MCP
    #: (``openenv/session/create``): no connection ends them, so they are capped and closed
    #: after this many idle seconds; None for the cap: a quarter of ``max_sessions``
    http_session_timeout: float = 300.0
    max_http_sessions: int | None = None
    #: the pool's base seed, used for seedless resets
    seed: int = 0
    #: seconds a session waits for the pool at most (None: 10 x step_timeout + 60); the pool
    #: answers within its own deadlines, so this only bounds a pool that stopped answering
    call_timeout: float | None = None
    #: bounds on what a client may send in one step
    max_action_chars: int = 16_384
    max_actions_per_step: int = 64
    backend_options: dict[str, Any] = field(default_factory=dict)
    #: front-end processes on the one port (`turnpool.serve.fronts`): each serves its share
    #: of the sessions over its share of the workers; 1: one process serves everything
    frontends: int = 1
    #: the key that signs served snapshots (`turnpool.serve.snapshots`): a server restores
    #: only snapshots signed with its key. Fresh per server unless set (the fronts of one
    #: server share theirs); servers given one key accept each other's snapshots
    snapshot_key: str = field(default_factory=lambda: secrets.token_hex(16), repr=False,
                              compare=False)
    #: OpenEnv's server mode: ``simulation`` serves HTTP ``/reset``, ``/step`` and ``/state``
    #: (training); ``production`` leaves them out, as OpenEnv's does (agents act through MCP
    #: tools and WebSocket sessions only)
    mode: str = "simulation"

    def __post_init__(self) -> None:
        if self.mode not in SERVE_MODES:
            raise ValueError(f"mode must be one of {', '.join(SERVE_MODES)}, not "
                             f"{self.mode!r}")

    def http_cap(self) -> int:
        if self.max_http_sessions is not None:
            return self.max_http_sessions
        return max(1, self.max_sessions // 4)

    def call_timeout_s(self) -> float:
        if self.call_timeout is not None:
            return self.call_timeout
        return 10 * max(self.step_timeout or 0.0, self.reset_timeout or 0.0) + 60.0


class PoolEngine(SlotEngine):
    """The `SlotEngine` of a server: ``max_sessions`` slots built from `ServeSettings`; each
    env is built when its slot's first episode starts (``lazy_build``), so a server sized for
    many sessions starts at once and holds only the envs it used."""

    def __init__(self, settings: ServeSettings) -> None:
        self.settings = settings
        super().__init__(settings.env, capacity=settings.max_sessions, seed=settings.seed,
                         env_kwargs=dict(settings.env_kwargs), backend=settings.backend,
                         num_workers=settings.num_workers, step_timeout=settings.step_timeout,
                         reset_timeout=settings.reset_timeout, on_error="flag",
                         lazy_build=True, **settings.backend_options)


def retryable(failure: str | None) -> bool:
    """Whether running the episode again from its seed can succeed (`FAILURE_CLASSES`)."""
    return bool(failure is not None and FAILURE_CLASSES.get(failure, False))


__all__ = ["PoolEngine", "PoolFull", "PoolTimeout", "ServeSettings", "SlotReset", "retryable"]
