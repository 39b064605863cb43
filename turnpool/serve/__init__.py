"""``turnpool serve``: the env pool behind OpenEnv's wire protocol.

Trainers that speak OpenEnv (TRL, SkyRL, NeMo Gym, verifiers, ...) connect to one URL and get
one env per session, while the envs run in an `EnvPool` on any backend, with per-env process
isolation, enforced step timeouts, crash recovery and exact seeds. One module per concern
(``docs/design.md`` draws the map): ``engine`` (settings, the pool's
`turnpool.pool.slots.SlotEngine`), ``sessions`` (the session table and its one timer),
``verbs`` (the served-verb table every face iterates), ``service`` (the verbs' handlers:
what each OpenEnv message does), ``codec`` (WebSocket frames), ``ws`` (the one ``/ws`` path,
straight from the socket), ``app`` (the HTTP routes), ``mcp`` (the verbs as MCP tools),
``status`` / ``metrics`` / ``page`` (what the server says about itself), ``running``
(uvicorn, the background `TurnpoolServer`), ``main`` (the foreground ``serve``), ``fronts``
(several front processes on one port) and ``journal`` / ``resume`` (``--state-dir``:
sessions that survive a restart). Nothing here imports WebShop code.

Example:
    >>> from turnpool.serve import ServeSettings, TurnpoolServer
    >>> with TurnpoolServer(ServeSettings(env="trivial", max_sessions=2,
    ...                                   backend="sequential")) as server:
    ...     import httpx
    ...     httpx.get(server.url + "/health").json()
    {'status': 'healthy'}
"""

from __future__ import annotations

from turnpool.serve.app import create_app
from turnpool.serve.engine import PoolEngine, ServeSettings
from turnpool.serve.main import serve
from turnpool.serve.running import TurnpoolServer, check_bind, is_loopback, run_app

__all__ = ["PoolEngine", "ServeSettings", "TurnpoolServer", "check_bind", "create_app",
           "is_loopback", "run_app", "serve"]
