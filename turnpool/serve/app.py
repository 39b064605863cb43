"""The HTTP side of ``turnpool serve``: the FastAPI app over a `Service`: one route per
served verb (`turnpool.serve.verbs.VERBS`: ``POST /reset``, ``/step``, ``/close``, ``/fork``,
``/snapshot``, ``/restore``, ``/mcp``, ``GET /state``), and ``/schema``, ``/metadata``,
``/health``, ``/metrics``, ``/api/status`` and the status page. WebSocket sessions (``/ws``)
never reach it: `turnpool.serve.ws` serves them from the socket.

HTTP ``/reset`` is stateless by default, as OpenEnv's is (a slot for that call alone); with
``"stateful": true`` it opens a session whose id comes back in ``metadata.session_id`` for
``/step``, ``/state`` and ``/close``; a ``/step`` naming no session is OpenEnv's simulation
mode (a fresh slot, reset from the body's ``seed``, stepped, released). In OpenEnv's
production mode (``ServeSettings.mode``) ``/reset``, ``/step`` and ``/state`` are not served.
Branching (POST, each naming a held ``session_id``): ``/fork`` answers a new held session's
``session_id`` and observation, ``/snapshot`` answers
``{"snapshot": value}``, ``/restore`` (``snapshot``) answers the observation, in a new held
session when it names none. Sessions held over HTTP or MCP are capped and closed when idle
(`turnpool.serve.sessions`). When every slot is held a new session gets a
``CAPACITY_REACHED`` error (HTTP 503) at once instead of waiting. The pydantic models below
only publish ``/schema``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, Field

import turnpool.serve.mcp as mcp
from turnpool.extras import MissingExtra
from turnpool.serve.engine import PoolEngine
from turnpool.serve.errors import ProtocolError
from turnpool.serve.jsonio import dumps
from turnpool.serve.metrics import CONTENT_TYPE, Metrics
from turnpool.serve.page import STATUS_PAGE
from turnpool.serve.service import Service
from turnpool.serve.status import StepRate, status
from turnpool.serve.verbs import VERBS, Verb, tool_calls

#: Paths served without the token: the page (it asks for the token itself) and the health
#: probe, which load balancers and OpenEnv's tools call without credentials.
OPEN_PATHS = frozenset({"/", "/health"})
# The OpenEnv HTTP API version turnpool serve implements (what OpenEnv's create_app declares).
OPENENV_HTTP_VERSION = "1.0.0"


# ---------------------------------------------------------------------- /schema models
class TurnpoolAction(BaseModel):
    """One turn: ``action`` (an action name, an action id or free text, as the env takes
    it) or ``actions`` (several, executed in order until the episode ends)."""

    action: str | int | None = Field(default=None, description="one action")
    actions: list[str | int] | None = Field(default=None, description="several actions")
    metadata: dict[str, Any] = Field(default_factory=dict)


class TurnpoolObservation(BaseModel):
    """The env's text observation, its info dict and the episode flags."""

    text: str = Field(description="the observation text")
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = Field(default_factory=dict)
    done: bool = False
    reward: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class TurnpoolState(BaseModel):
    episode_id: str | None = None
    step_count: int = 0
    seed: int | None = None
    session_id: str | None = None
    env: str | None = None
    done: bool = False


class Peers(Protocol):
    """What the app of one front of several needs of the others
    (`turnpool.serve.fronts.link.FrontLink`); None on a single front."""

    def install(self, app: FastAPI) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def local_status(self) -> dict[str, Any]: ...

    async def merged_status(self, local: dict[str, Any]) -> dict[str, Any]: ...

    async def merged_metrics(self, local: bytes) -> bytes: ...


def json_response(obj: Any, status_code: int = 200) -> Response:
    return Response(dumps(obj), status_code=status_code, media_type="application/json")


def error_response(exc: ProtocolError) -> Response:
    return json_response({"detail": exc.data()}, exc.status)


# ---------------------------------------------------------------------- the app
def create_app(engine: PoolEngine, token: str | None = None) -> FastAPI:
    """The FastAPI app of ``turnpool serve`` over a started engine (which it does not own)."""
    return app_for(Service(engine, token))


def app_for(service: Service, peers: Peers | None = None) -> FastAPI:
    """The app over ``service``; with ``peers``, the app of one front of several
    (`turnpool.serve.fronts`). Its lifespan runs the session table's sweep."""
    rate = StepRate(service)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        sweeper = asyncio.create_task(service.sessions.sweep_forever(rate.tick))
        if peers is not None:
            await peers.start()
        try:
            yield
        finally:
            if peers is not None:
                await peers.stop()
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper

    # OpenAPI's info.version is the OpenEnv HTTP standard a server speaks: `openenv validate`
    # reads it as the profile (1.x), so it is OpenEnv's API version, not turnpool's.
    app = FastAPI(title=f"turnpool serve: {service.settings.env}", lifespan=lifespan,
                  version=OPENENV_HTTP_VERSION)
    if peers is not None:
        peers.install(app)  # its router: a request naming another front's session goes there

    @app.middleware("http")
    async def check_token(request: Request, call_next: Callable[[Request], Awaitable[Any]]
                          ) -> Response:
        if request.url.path not in OPEN_PATHS and not service.authorized(request.headers,
                                                                          request.query_params):
            return JSONResponse({"detail": "missing or wrong token"}, status_code=401)
        response: Response = await call_next(request)
        return response

    _status_routes(app, service, rate, peers)
    _info_routes(app, service)
    for verb in VERBS:
        if service.settings.mode == "simulation" or not verb.simulation_http:
            _verb_route(app, service, verb)
    return app


def _status_routes(app: FastAPI, service: Service, rate: StepRate, peers: Peers | None
                   ) -> None:
    """The page, ``/api/status``, ``/metrics`` and ``/health``."""
    try:
        metrics: Metrics | None = Metrics(service, rate)
        missing = ""
    except MissingExtra as exc:  # prometheus-client is optional: /metrics says what to do
        metrics, missing = None, str(exc)
    if metrics is not None:
        service.observe_step = metrics.observe_step

    def whole(request: Request) -> bool:
        """Whether to answer for every front (not asked for this one alone)."""
        return peers is not None and request.query_params.get("local") != "1"

    @app.get("/", response_class=HTMLResponse)
    async def page() -> HTMLResponse:
        return HTMLResponse(STATUS_PAGE)

    @app.get("/metrics")
    async def metrics_route(request: Request) -> Response:
        if metrics is None:
            return json_response({"detail": missing}, 501)
        text = metrics.render()
        if whole(request):
            assert peers is not None
            text = await peers.merged_metrics(text)
        return Response(text, media_type=CONTENT_TYPE)

    @app.get("/api/status")
    async def api_status(request: Request) -> Response:
        out = status(service, rate, metrics.recent_latency() if metrics is not None else {})
        if peers is not None:
            out.update(peers.local_status())
        if whole(request):
            assert peers is not None
            out = await peers.merged_status(out)
        return json_response(out)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "healthy"}


def _info_routes(app: FastAPI, service: Service) -> None:
    """``/metadata`` and ``/schema``: what the env is and what it takes."""
    env, tools = service.settings.env, service.tools

    @app.get("/metadata")
    async def metadata() -> dict[str, Any]:
        from turnpool import __version__
        from turnpool.envs.registry import resolve

        cls, _ = resolve(env)
        doc = inspect.cleandoc(cls.__doc__ or "")
        first = doc.splitlines()[0] if doc else f"turnpool env {env}"
        return {"name": env, "description": first,
                "readme_content": _readme(env, doc, tools),
                "version": __version__, "author": None, "documentation_url": None}

    @app.get("/schema")
    async def schema() -> dict[str, Any]:
        action = TurnpoolAction.model_json_schema()
        if tools.action_names:  # a discrete env: its actions by name (or id)
            names = list(tools.action_names)
            one = {"anyOf": [{"type": "string", "enum": names}, {"type": "integer"}],
                   "description": f"one action: {', '.join(names)} (or its id)"}
            action["properties"]["action"] = {**one, "default": None}
            action["properties"]["actions"] = {"type": "array", "items": one,
                                               "description": "several actions, in order"}
        return {"action": action,
                "observation": TurnpoolObservation.model_json_schema(),
                "state": TurnpoolState.model_json_schema()}


def _verb_route(app: FastAPI, service: Service, verb: Verb) -> None:
    """``POST /name`` (``GET`` for a ``http_get`` verb): the verb's HTTP answer
    (`Verb.http`) to the request's body (its query for ``GET``); a `ProtocolError`, raised
    while the answer is made or awaited, is the error response."""
    async def route(request: Request) -> Response:
        try:
            data = dict(request.query_params) if verb.http_get else \
                verb.http_read(await request.body())
            return json_response(await verb.http(service, verb, data))
        except ProtocolError as exc:
            return error_response(exc)

    add = app.get if verb.http_get else app.post
    add("/" + verb.name, name="http_" + verb.name)(route)


def _action_format(tools: mcp.Tools) -> str:
    if tools.action_names:
        return ("one of the action names (or its id) as `action`, or several as `actions`; "
                f"names: {', '.join(tools.action_names)}")
    return "free text as `action` (or several as `actions`), as the env's instruction says"


def _readme(env: str, doc: str, tools: mcp.Tools) -> str:
    parts = [f"# {env}", doc] if doc else [f"# {env}"]
    if tools.instruction:
        parts.append(f"## Instruction\n{tools.instruction}")
    parts.append(f"## Actions\n{_action_format(tools)}")
    parts.append("## Tools (MCP)\n" + ", ".join(tool_calls(tools)))
    return "\n\n".join(parts)


__all__ = ["OPEN_PATHS", "Peers", "TurnpoolAction", "TurnpoolObservation", "TurnpoolState",
           "app_for", "create_app"]
