"""The served verbs of ``turnpool serve``: one table, `VERBS`, that every face iterates.

A verb is one thing a client asks of a session (``reset``, ``step``, ``state``, ``fork``,
``snapshot``, ``restore``, ``close``, ``mcp``). Its entry says how its request is checked
(``parse``), which handler runs it (``run``, over `turnpool.serve.service.Service`), what
kind of reply it is (``reply``), how HTTP reaches it (``http``: which session a request
means, opened or not), whether a multi-front server routes it to the front holding its
session (``routed``) and its MCP tools (``tools``). The faces only iterate the table:

- ``/ws`` (`turnpool.serve.ws.answer`): ``{"type": name, "data": ...}`` answers
  ``{"type": reply, "data": run(...)}``; a verb whose ``reply`` is None ends the connection;
- HTTP (`turnpool.serve.app`): ``POST /name`` (``GET`` where ``http_get``) answers
  ``http(...)``;
- MCP (`turnpool.serve.mcp`): the verb's tools; a call answers ``run(...)`` as an MCP result
  whose text ``mcp.REPLY_TEXT`` picks by the reply kind;
- several fronts (`turnpool.serve.fronts.routing.ROUTED_PATHS`): ``/name`` of every routed
  verb.

The reply's ``data`` is the handler's value on every face, so a verb answers the same
whichever way it came.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import turnpool.serve.mcp as mcp
from turnpool.serve.errors import ProtocolError
from turnpool.serve.jsonio import MAX_MESSAGE_CHARS
from turnpool.serve.service import Service
from turnpool.serve.sessions import Session

#: A verb's handler: the reply's ``data`` for one checked request of a session.
Handler = Callable[[Service, Session, Any], Awaitable[Any]]
#: How HTTP answers a verb: (service, verb, the request's data) -> the response body.
HttpAnswer = Callable[[Service, "Verb", Any], Awaitable[Any]]


def _as_is(data: Any) -> Any:
    return data


def json_object(raw: bytes) -> dict[str, Any]:
    """An HTTP body as a JSON object ({} when empty); `ProtocolError` for anything else."""
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


def http_session(service: Service, session_id: Any) -> Session:
    """The held HTTP session named ``session_id``; `ProtocolError` (404) for any other."""
    session = service.sessions.get(session_id)
    if session is None or session.kind != "http":
        raise ProtocolError("SESSION_ERROR", f"unknown session_id {session_id!r} (open "
                            "one with POST /reset; idle ones are closed)", status=404)
    return session


async def held(service: Service, verb: Verb, data: dict[str, Any]) -> Any:
    """HTTP's default: the verb on the held session that ``data["session_id"]`` names."""
    session = http_session(service, data.get("session_id"))
    return await verb.run(service, session, verb.parse(verb.http_data(data)))


@dataclass(frozen=True)
class Verb:
    """One served verb (see the module's docstring for how each face reads it)."""

    #: the ``/ws`` message type, the HTTP path (``/name``) and the MCP tool's name
    name: str
    run: Handler
    #: the ``/ws`` reply's type (``mcp.REPLY_TEXT`` has each kind's MCP text); None: the
    #: message ends the WebSocket connection (its handler runs on the other faces)
    reply: str | None
    #: checks a request's data (a ``/ws`` message's ``data``, an MCP call's arguments, what
    #: ``http_data`` takes from an HTTP body) before ``run``
    parse: Callable[[Any], Any] = _as_is
    http: HttpAnswer = held
    #: the request's data from an HTTP body (``json_object`` of it) or query
    http_data: Callable[[Any], Any] = _as_is
    #: HTTP body -> what ``http`` gets (``GET`` verbs get the query's dict instead)
    http_read: Callable[[bytes], Any] = json_object
    http_get: bool = False
    #: a request naming another front's session goes to that front
    routed: bool = True
    #: the verb's MCP tools, given the env's action names and the tool names taken by the
    #: other verbs' (which an action's tool may not take)
    tools: Callable[[tuple[str, ...], frozenset[str]], list[mcp.Tool]] = lambda *_: []
    #: one of OpenEnv's simulation controls: no HTTP route in production mode
    #: (`turnpool.serve.engine.ServeSettings.mode`)
    simulation_http: bool = False
    #: MCP: a call without a session gets a slot for that call alone (else it needs one)
    mcp_stateless: bool = False
    #: MCP: a session with no episode starts one (seedless) before the verb runs
    mcp_episode_first: bool = False


# ---------------------------------------------------------------------- handlers
async def _reset(service: Service, session: Session, data: Any) -> dict[str, Any]:
    return await service.reset(session, data)


async def _step(service: Service, session: Session, data: Any) -> dict[str, Any]:
    if isinstance(data, dict) and "type" in data:  # OpenEnv's MCP actions (call_tool, ...)
        return await mcp.step_action(service, tool_calls(service.tools), data, session)
    return await service.step(session, data)


async def _state(service: Service, session: Session, data: Any) -> dict[str, Any]:
    return service.state(session)


async def _fork(service: Service, session: Session, data: Any) -> dict[str, Any]:
    return await service.fork(session)


async def _snapshot(service: Service, session: Session, data: Any) -> dict[str, Any]:
    return {"snapshot": await service.snapshot(session)}


async def _restore(service: Service, session: Session, data: Any) -> dict[str, Any]:
    return await service.restore(session, data)


async def _close(service: Service, session: Session, data: Any) -> dict[str, Any]:
    service.sessions.close(session)
    return {"closed": True}


async def _mcp(service: Service, session: Session | None, data: Any) -> dict[str, Any]:
    return await mcp.handle(service, tool_calls(service.tools), data, session)


def _reset_data(data: Any) -> dict[str, Any]:
    data = data or {}
    if not isinstance(data, dict):
        raise ProtocolError("VALIDATION_ERROR", "reset data must be an object")
    return data


# ---------------------------------------------------------------------- HTTP sessions
async def _http_reset(service: Service, verb: Verb, data: dict[str, Any]) -> Any:
    """``/reset``: in a held session (``session_id``), a new held one (``stateful``) or
    one for this call alone (OpenEnv's HTTP reset is stateless)."""
    table = service.sessions
    stateful = data.pop("stateful", False)
    if not isinstance(stateful, bool):
        raise ProtocolError("VALIDATION_ERROR", "stateful must be true or false")
    if data.get("session_id") is not None:
        session = http_session(service, data["session_id"])
    else:
        session = table.open("http" if stateful else "once")
    try:
        out = await verb.run(service, session, verb.parse(data))
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


async def _http_step(service: Service, verb: Verb, data: dict[str, Any]) -> Any:
    """``/step``: on the held session ``session_id`` names; without one, OpenEnv's
    simulation mode: a fresh env (a slot for this call alone), reset first (from the
    request's ``seed``; a ``list_tools`` action needs no episode), stepped, released."""
    if data.get("session_id") is not None:
        return await held(service, verb, data)
    action = verb.parse(verb.http_data(data))
    reset: dict[str, Any] = {key: data[key] for key in ("seed", "episode_id") if key in data}
    session = service.sessions.open("once")
    try:
        if not (isinstance(action, dict) and action.get("type") == "list_tools"):
            await service.reset(session, reset)
        out = await verb.run(service, session, action)
    finally:
        service.sessions.close(session)
    for meta in (out.get("metadata"), out["observation"].get("metadata")):
        if meta:
            meta["session_id"] = None  # the session is gone
    return out


async def _http_restore(service: Service, verb: Verb, data: dict[str, Any]) -> Any:
    """``/restore``: into a held session (``session_id``), or a new held one."""
    if data.get("session_id") is not None:
        return await held(service, verb, data)
    service.snapshots.decode(data.get("snapshot"))  # a refused one opens no session
    session = service.sessions.open("http")
    try:
        return await verb.run(service, session, verb.parse(data))
    except BaseException:
        service.sessions.close(session)
        raise


async def _http_state(service: Service, verb: Verb, query: dict[str, str]) -> Any:
    """``GET /state``: a held session's state (``session_id``), or a blank one."""
    if query.get("session_id") is None:
        return service.state(None)
    return await held(service, verb, query)


async def _http_mcp(service: Service, verb: Verb, raw: bytes) -> Any:
    """``POST /mcp``: JSON-RPC, whose errors are JSON-RPC answers too."""
    return await rpc(service, None, raw)


async def rpc(service: Service, session: Session | None, raw: bytes | str
              ) -> dict[str, Any]:
    """The JSON-RPC response to one raw request, the ``mcp`` verb's, on ``session`` (a
    WebSocket's on ``/mcp``) or none (``POST /mcp``); a request that is no JSON, or too
    large, gets a JSON-RPC error too."""
    if len(raw) > MAX_MESSAGE_CHARS:
        return mcp.rpc_error(mcp.INVALID_REQUEST, "request too large")
    try:
        message = json.loads(raw) if raw.strip() else {}
    except ValueError:
        return mcp.rpc_error(mcp.PARSE_ERROR, "Parse error")
    return await _mcp(service, session, message)


# ---------------------------------------------------------------------- MCP tools
_NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {},
                                 "additionalProperties": False}


def _tool(name: str, description: str, schema: dict[str, Any] | None = None
          ) -> Callable[[tuple[str, ...], frozenset[str]], list[mcp.Tool]]:
    one = [mcp.Tool(name, description, schema or _NO_ARGUMENTS)]
    return lambda *_: one


def _step_tools(names: tuple[str, ...], taken: frozenset[str]) -> list[mcp.Tool]:
    """One tool per env action (no arguments; the first action of each tool name), and
    ``act`` (any action)."""
    actions: dict[str, str] = {}
    for name in names:
        tool = mcp.tool_name(name)
        if tool and tool not in taken and tool not in actions:
            actions[tool] = str(name)
    tools = [mcp.Tool(tool, f"Take the action {action!r}.", _NO_ARGUMENTS,
                      fixed={"action": action}) for tool, action in actions.items()]
    act_schema: dict[str, Any] = {"type": "string"}
    if names:
        act_schema = {"type": "string", "enum": list(names)}
    tools.append(mcp.Tool(
        "act", "Take one action as the env takes it"
        + (f" (one of {', '.join(names)})" if names else " (free text)") + ".",
        {"type": "object", "required": ["action"], "additionalProperties": False,
         "properties": {"action": act_schema}}))
    return tools


# ---------------------------------------------------------------------- the table
#: Every served verb, in MCP's tool listing order.
VERBS: tuple[Verb, ...] = (
    Verb("reset", _reset, "observation", parse=_reset_data, http=_http_reset,
         tools=_tool("reset", "Start a new episode (from `seed`, or the server's schedule); "
                     "returns the first observation.",
                     {"type": "object", "additionalProperties": False,
                      "properties": {"seed": {"type": "integer", "minimum": 0}}}),
         mcp_stateless=True, simulation_http=True),
    Verb("step", _step, "observation", http=_http_step,
         http_data=lambda body: body.get("action"),
         tools=_step_tools, mcp_stateless=True, mcp_episode_first=True,
         simulation_http=True),
    Verb("state", _state, "state", http=_http_state, http_get=True, simulation_http=True),
    Verb("fork", _fork, "fork",
         tools=_tool("fork", "Copy this session's episode into a new session; returns its "
                     "session_id (and its observation).")),
    Verb("snapshot", _snapshot, "snapshot",
         tools=_tool("snapshot", "This session's episode as a value to pass to restore "
                     "later.")),
    Verb("restore", _restore, "observation", http=_http_restore,
         tools=_tool("restore", "Put this session into a snapshot's state; returns the "
                     "observation.",
                     {"type": "object", "required": ["snapshot"],
                      "additionalProperties": False,
                      "properties": {"snapshot": {"type": "object"}}})),
    Verb("close", _close, None),
    Verb("mcp", _mcp, "mcp", http=_http_mcp, http_read=_as_is),
)
#: The verbs by name (the ``/ws`` message type).
BY_NAME: dict[str, Verb] = {verb.name: verb for verb in VERBS}

#: The MCP tools of each env's `mcp.Tools` (made once per server).
_CALLS: weakref.WeakKeyDictionary[mcp.Tools, dict[str, tuple[Verb, mcp.Tool]]] = \
    weakref.WeakKeyDictionary()


def tool_calls(tools: mcp.Tools) -> dict[str, tuple[Verb, mcp.Tool]]:
    """Every MCP tool of the verbs for the env of ``tools``, by name, with its verb, in
    listing order."""
    calls = _CALLS.get(tools)
    if calls is None:
        # the tools every env has: an action's tool may not take their names
        fixed = frozenset(tool.name for verb in VERBS for tool in verb.tools((), frozenset()))
        calls = {tool.name: (verb, tool) for verb in VERBS
                 for tool in verb.tools(tools.action_names, fixed)}
        _CALLS[tools] = calls
    return calls


__all__ = ["BY_NAME", "rpc", "tool_calls", "VERBS", "Verb", "http_session", "json_object"]
