"""The HTTP side of ``turnpool serve``: the FastAPI app over a `Service` (``/reset``,
``/step``, ``/state``, ``/close``, ``/fork``, ``/snapshot``, ``/restore``, ``/mcp``,
``/schema``, ``/metadata``, ``/health``, ``/metrics``, ``/api/status`` and the status page).
WebSocket sessions (``/ws``) never reach it: `turnpool.serve.ws` serves them from the
socket.

HTTP ``/reset`` is stateless by default, as OpenEnv's is (a slot for that call alone); with
``"stateful": true`` it opens a session whose id comes back in ``metadata.session_id`` for
``/step``, ``/state`` and ``/close``. Branching (POST, each naming a held ``session_id``):
``/fork`` answers a new held session's ``session_id`` and observation, ``/snapshot`` answers
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
import json
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
from turnpool.serve.service import MAX_MESSAGE_CHARS, Service
from turnpool.serve.sessions import Session
from turnpool.serve.status import StepRate, status

#: Paths served without the token: the page (it asks for the token itself) and the health
#: probe, which load balancers and OpenEnv's tools call without credentials.
OPEN_PATHS = frozenset({"/", "/health"})


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


async def body_of(request: Request) -> dict[str, Any]:
    """A request's JSON object body ({} when empty); `ProtocolError` for anything else."""
    raw = await request.body()
    if len(raw) > MAX_MESSAGE_CHARS:
        raise ProtocolError("VALIDATION_ERROR", "request too large", status=413)
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ProtocolError("INVALID_JSON", f"Invalid JSON: {exc}", status=422) from exc
    if not isinstance(data, dict):
        raise ProtocolError("VALIDATION_ERROR", "the body must be an object", status=422)
    return data


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

    app = FastAPI(title=f"turnpool serve: {service.settings.env}", lifespan=lifespan)
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
    _session_routes(app, service)
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


def _session_routes(app: FastAPI, service: Service) -> None:
    """``/reset``, ``/step``, ``/state``, ``/close``, ``/fork``, ``/snapshot``, ``/restore``
    and ``/mcp``."""
    table = service.sessions

    def http_session(session_id: Any) -> Session:
        session = table.get(session_id)
        if session is None or session.kind != "http":
            raise ProtocolError("SESSION_ERROR", f"unknown session_id {session_id!r} (open "
                                "one with POST /reset; idle ones are closed)", status=404)
        return session

    @app.post("/mcp")
    async def mcp_endpoint(request: Request) -> Response:
        raw = await request.body()
        if len(raw) > MAX_MESSAGE_CHARS:
            return json_response(mcp.rpc_error(mcp.INVALID_REQUEST, "request too large"))
        try:
            message = json.loads(raw) if raw.strip() else {}
        except ValueError:
            return json_response(mcp.rpc_error(mcp.PARSE_ERROR, "Parse error"))
        return json_response(await mcp.handle(service, service.tools, message))

    def session_of(data: dict[str, Any]) -> Session:
        return http_session(data.get("session_id"))

    async def snapshot(data: dict[str, Any]) -> dict[str, Any]:
        return {"snapshot": await service.snapshot(session_of(data))}

    async def close(data: dict[str, Any]) -> dict[str, Any]:
        table.close(session_of(data))
        return {"closed": True}

    answers: dict[str, Callable[[dict[str, Any]], Awaitable[Any]]] = {
        "/reset": lambda data: _reset(service, data, http_session),
        "/step": lambda data: service.step(session_of(data), data.get("action")),
        "/fork": lambda data: service.fork(session_of(data)),
        "/snapshot": snapshot,
        "/restore": lambda data: _restore(service, data, http_session),
        "/close": close,
    }
    for path, answer in answers.items():
        _post_route(app, path, answer)

    @app.get("/state")
    async def http_state(session_id: str | None = None) -> Response:
        if session_id is None:
            return json_response(TurnpoolState(env=service.settings.env).model_dump())
        try:
            return json_response(service.state(http_session(session_id)))
        except ProtocolError as exc:
            return error_response(exc)


def _post_route(app: FastAPI, path: str,
                answer: Callable[[dict[str, Any]], Awaitable[Any]]) -> None:
    """``POST path``: its JSON body answered by ``answer`` (a `ProtocolError`, raised while
    the answer is made or awaited, is the error response)."""
    async def route(request: Request) -> Response:
        try:
            return json_response(await answer(await body_of(request)))
        except ProtocolError as exc:
            return error_response(exc)

    app.post(path, name="http_" + path.strip("/"))(route)


async def _reset(service: Service, data: dict[str, Any],
                 http_session: Callable[[Any], Session]) -> dict[str, Any]:
    """``/reset``: in a held session (``session_id``), a new held one (``stateful``) or
    one for this call alone."""
    table = service.sessions
    stateful = data.pop("stateful", False)
    if not isinstance(stateful, bool):
        raise ProtocolError("VALIDATION_ERROR", "stateful must be true or false")
    if data.get("session_id") is not None:
        session = http_session(data["session_id"])
    else:  # OpenEnv's HTTP reset is stateless; a held session is asked for
        session = table.open("http" if stateful else "once")
    try:
        out = await service.reset(session, data)
    except ProtocolError:
        if not session.started and session.step_count == 0 and \
                data.get("session_id") is None:
            table.close(session)  # a session that never started is not kept
        raise
    if session.kind == "once":
        table.close(session)
        out["metadata"]["session_id"] = None
        out["observation"]["metadata"]["session_id"] = None
    return out


async def _restore(service: Service, data: dict[str, Any],
                   http_session: Callable[[Any], Session]) -> dict[str, Any]:
    """``/restore``: into a held session (``session_id``), or a new held one."""
    if data.get("session_id") is not None:
        return await service.restore(http_session(data["session_id"]), data)
    service.snapshots.decode(data.get("snapshot"))  # a refused one opens no session
    session = service.sessions.open("http")
    try:
        return await service.restore(session, data)
    except BaseException:
        service.sessions.close(session)
        raise


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
    parts.append("## Tools (MCP)\n" + ", ".join(t["name"] for t in tools.listing()))
    return "\n\n".join(parts)


__all__ = ["OPEN_PATHS", "Peers", "TurnpoolAction", "TurnpoolObservation", "TurnpoolState",
           "app_for", "create_app"]
