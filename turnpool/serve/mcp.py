"""OpenEnv's MCP face of ``turnpool serve``: the env's actions as tools, over JSON-RPC 2.0.

OpenEnv's MCP clients (``MCPToolClient``) create a session with ``openenv/session/create`` on
``POST /mcp``, attach a WebSocket to it (``/ws?session_id=...``) for ``reset``, then list and
call tools on ``POST /mcp`` (or with ``{"type": "mcp", "data": <request>}`` frames on the
WebSocket). ``openenv validate`` checks that ``POST /mcp`` answers JSON-RPC.

Tools: ``reset`` (``seed`` optional) starts an episode; a discrete env gets one tool per
action (``up``, ``left``, ... for Sokoban; each is the action's name, lower-cased, with
anything but letters, digits and ``_`` made ``_``); every env gets ``act`` (``action``: the
action as the env takes it: a name, an id or free text). A tool call is one turn of the
session's env; its result carries the observation text as MCP ``content`` and the whole
observation payload (reward, done, info, metadata) as ``structuredContent`` / ``data``. A
failed turn is a JSON-RPC error whose ``data`` names turnpool's failure class. A turn on a
session with no episode starts one first (seedless); a ``tools/call`` without a
``session_id`` is stateless: a slot is leased for that call alone.

Branching tools (they need a session: the WebSocket's, or ``session_id``): ``fork`` answers
a new session's id (``structuredContent.session_id``) playing a copy of this episode;
``snapshot`` answers the episode as a JSON value (``structuredContent.snapshot``);
``restore`` (``snapshot``: such a value) puts the session into it and answers its
observation. They are the ``/ws`` messages of the same names (`turnpool.serve.service`).
"""

from __future__ import annotations

import json
import re
from typing import Any, Protocol

from turnpool.rollout.prompts import describe_env
from turnpool.serve.errors import ProtocolError
from turnpool.serve.sessions import SessionTable


class Sessions(Protocol):
    """What this module needs of the server (`turnpool.serve.service.Service`)."""

    settings: Any
    sessions: SessionTable

    async def reset(self, session: Any, data: dict[str, Any]) -> dict[str, Any]: ...

    async def step(self, session: Any, data: Any) -> dict[str, Any]: ...

    async def fork(self, session: Any) -> dict[str, Any]: ...

    async def snapshot(self, session: Any) -> dict[str, Any]: ...

    async def restore(self, session: Any, data: Any) -> dict[str, Any]: ...

#: JSON-RPC 2.0 error codes
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
SERVER_ERROR = -32000

_NOT_NAME = re.compile(r"[^a-z0-9_]")
#: Tool names that are not the env's actions.
RESERVED = frozenset({"reset", "act", "fork", "snapshot", "restore"})


def rpc_result(result: Any, request_id: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "result": result, "id": request_id}


def rpc_error(code: int, message: str, request_id: Any = None,
              data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "error": error, "id": request_id}


class Tools:
    """The tools of one env as configured: ``tool name -> action`` plus ``reset`` and ``act``."""

    def __init__(self, env: str, env_kwargs: dict[str, Any]) -> None:
        desc = describe_env(env, env_kwargs)
        names: tuple[str, ...] = ()
        if desc.action_lookup:
            names = tuple(desc.action_lookup[k] for k in sorted(desc.action_lookup))
        elif desc.episode_action_names:
            names = desc.episode_action_names
        self.actions: dict[str, str] = {}
        for name in names:
            tool = _NOT_NAME.sub("_", str(name).lower())
            if tool and tool not in RESERVED and tool not in self.actions:
                self.actions[tool] = str(name)
        self.instruction = desc.instruction
        self.action_names = names

    def listing(self) -> list[dict[str, Any]]:
        empty = {"type": "object", "properties": {}, "additionalProperties": False}
        tools: list[dict[str, Any]] = [{
            "name": "reset",
            "description": "Start a new episode (from `seed`, or the server's schedule); "
                           "returns the first observation.",
            "inputSchema": {"type": "object", "additionalProperties": False,
                            "properties": {"seed": {"type": "integer", "minimum": 0}}},
        }]
        for tool, action in self.actions.items():
            tools.append({"name": tool, "description": f"Take the action {action!r}.",
                          "inputSchema": empty})
        act_schema: dict[str, Any] = {"type": "string"}
        if self.action_names:
            act_schema = {"type": "string", "enum": list(self.action_names)}
        tools.append({
            "name": "act",
            "description": "Take one action as the env takes it"
                           + (f" (one of {', '.join(self.action_names)})"
                              if self.action_names else " (free text)") + ".",
            "inputSchema": {"type": "object", "required": ["action"],
                            "additionalProperties": False,
                            "properties": {"action": act_schema}},
        })
        return tools + _BRANCH_TOOLS


_BRANCH_TOOLS: list[dict[str, Any]] = [
    {"name": "fork", "description": "Copy this session's episode into a new session; returns "
     "its session_id (and its observation).",
     "inputSchema": {"type": "object", "properties": {}, "additionalProperties": False}},
    {"name": "snapshot", "description": "This session's episode as a value to pass to "
     "restore later.",
     "inputSchema": {"type": "object", "properties": {}, "additionalProperties": False}},
    {"name": "restore", "description": "Put this session into a snapshot's state; returns "
     "the observation.",
     "inputSchema": {"type": "object", "required": ["snapshot"], "additionalProperties": False,
                     "properties": {"snapshot": {"type": "object"}}}},
]


async def handle(server: Sessions, tools: Tools, request: Any,
                 session: Any = None) -> dict[str, Any]:
    """The JSON-RPC response to one request (``session``: the WebSocket's own, if any)."""
    if not isinstance(request, dict) or request.get("jsonrpc") != "2.0" or \
            not isinstance(request.get("method"), str):
        return rpc_error(INVALID_REQUEST, "Invalid request: a JSON-RPC 2.0 object with a "
                         "'method' is expected",
                         request.get("id") if isinstance(request, dict) else None)
    request_id = request.get("id")
    method = request["method"]
    params = request.get("params") or {}
    if not isinstance(params, dict):
        return rpc_error(INVALID_PARAMS, "params must be an object", request_id)
    try:
        if method == "initialize":
            from turnpool import __version__

            return rpc_result({"protocolVersion": "2025-06-18",
                               "capabilities": {"tools": {"listChanged": False}},
                               "serverInfo": {"name": f"turnpool {server.settings.env}",
                                              "version": __version__}}, request_id)
        if method == "ping":
            return rpc_result({}, request_id)
        if method == "tools/list":
            return rpc_result({"tools": tools.listing()}, request_id)
        if method == "openenv/session/create":
            own = session or server.sessions.open("mcp")
            return rpc_result({"session_id": own.id}, request_id)
        if method == "openenv/session/close":
            target = server.sessions.get(str(params.get("session_id")))
            if target is None:
                return rpc_error(INVALID_PARAMS,
                                 f"Unknown session_id: {params.get('session_id')}", request_id)
            server.sessions.close(target)
            return rpc_result({"session_id": target.id, "closed": True}, request_id)
        if method == "tools/call":
            return rpc_result(await _call(server, tools, params, session), request_id)
        return rpc_error(METHOD_NOT_FOUND, f"Method not found: {method}", request_id)
    except ProtocolError as exc:
        code = INVALID_PARAMS if exc.code in ("VALIDATION_ERROR", "SESSION_ERROR") \
            else SERVER_ERROR
        return rpc_error(code, exc.message, request_id, exc.data())


async def _call(server: Sessions, tools: Tools, params: dict[str, Any],
                session: Any) -> dict[str, Any]:
    name = params.get("name")
    arguments = params.get("arguments") or {}
    if not isinstance(name, str) or not isinstance(arguments, dict):
        raise ProtocolError("VALIDATION_ERROR", "tools/call needs 'name' and an object of "
                            "'arguments'")
    if name in ("fork", "snapshot", "restore"):
        return await _branch(server, name, arguments, _session_of(server, params, session))
    if name == "reset":
        if set(arguments) - {"seed"}:
            raise ProtocolError("VALIDATION_ERROR", "reset takes only 'seed'")
        data: dict[str, Any] = {"seed": arguments.get("seed")}
        step = None
    elif name == "act":
        if set(arguments) != {"action"}:
            raise ProtocolError("VALIDATION_ERROR", "act takes one argument, 'action'")
        data, step = {}, {"action": arguments["action"]}
    elif name in tools.actions:
        if arguments:
            raise ProtocolError("VALIDATION_ERROR", f"{name} takes no arguments")
        data, step = {}, {"action": tools.actions[name]}
    else:
        raise ProtocolError("VALIDATION_ERROR", f"Tool not found: {name}")
    own = session
    if own is None and params.get("session_id") is not None:
        own = _session_of(server, params, session)
    temporary = own is None
    if own is None:  # stateless: a slot for this call alone
        own = server.sessions.open("once")
    try:
        if step is None or not own.started:  # a session with no episode starts one
            payload = await server.reset(own, data)
        if step is not None:
            payload = await server.step(own, step)
    finally:
        if temporary:
            server.sessions.close(own)
    return _result(payload["observation"]["text"], payload)


async def _branch(server: Sessions, name: str, arguments: dict[str, Any], session: Any
                  ) -> dict[str, Any]:
    """The ``fork``, ``snapshot`` and ``restore`` tools of ``session``."""
    if name != "restore" and arguments:
        raise ProtocolError("VALIDATION_ERROR", f"{name} takes no arguments")
    if name == "fork":
        out = await server.fork(session)
        return _result(out["observation"]["text"], out)
    if name == "snapshot":
        value = await server.snapshot(session)
        return _result(json.dumps(value), {"snapshot": value})
    if set(arguments) != {"snapshot"}:
        raise ProtocolError("VALIDATION_ERROR", "restore takes one argument, 'snapshot'")
    out = await server.restore(session, arguments)
    return _result(out["observation"]["text"], out)


def _session_of(server: Sessions, params: dict[str, Any], session: Any) -> Any:
    """The session a call is for: the WebSocket's own, else ``params.session_id``'s."""
    if session is not None:
        return session
    if params.get("session_id") is None:
        raise ProtocolError("SESSION_ERROR", "this tool needs a session: call it on a "
                            "WebSocket, or with a session_id (openenv/session/create)")
    own = server.sessions.get(str(params["session_id"]))
    if own is None:
        raise ProtocolError("SESSION_ERROR", f"Unknown session_id: {params['session_id']}")
    return own


def _result(text: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "structuredContent": data,
            "isError": False, "data": data}
