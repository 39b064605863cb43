"""OpenEnv's MCP face of ``turnpool serve``: the env's actions as tools, over JSON-RPC 2.0.

OpenEnv's MCP clients (``MCPToolClient``) create a session with ``openenv/session/create`` on
``POST /mcp``, attach a WebSocket to it (``/ws?session_id=...``) for ``reset``, then list and
call tools on ``POST /mcp``. The same requests come as ``{"type": "mcp", "data": <request>}``
frames on ``/ws``, as plain JSON-RPC on a WebSocket to ``/mcp`` (one session per
connection), or as OpenEnv's MCP actions through ``step`` (`step_action`: ``{"type":
"call_tool", "tool_name", "arguments"}`` and ``{"type": "list_tools"}``). ``openenv
validate`` checks that ``POST /mcp`` answers JSON-RPC.

Tools: ``reset`` (``seed`` optional) starts an episode; a discrete env gets one tool per
action (``up``, ``left``, ... for Sokoban; each is the action's name, lower-cased, with
anything but letters, digits and ``_`` made ``_``); every env gets ``act`` (``action``: the
action as the env takes it: a name, an id or free text). A tool call is one turn of the
session's env; its result carries the observation text as MCP ``content``, the tool's value
as ``data`` (what OpenEnv's ``MCPToolClient.call_tool`` returns: the observation text for an
env action or ``reset``, the new ``session_id`` for ``fork``, the value for ``snapshot``)
and the whole observation payload (reward, done, info, metadata) as ``structuredContent``.
A failed turn is a JSON-RPC error whose ``data`` names turnpool's failure class. A turn on a
session with no episode starts one first (seedless); a ``tools/call`` without a
``session_id`` is stateless: a slot is leased for that call alone.

Branching tools (they need a session: the WebSocket's, or ``session_id``): ``fork`` answers
a new session's id (``structuredContent.session_id``) playing a copy of this episode;
``snapshot`` answers the episode as a JSON value (``structuredContent.snapshot``);
``restore`` (``snapshot``: such a value) puts the session into it and answers its
observation. They are the ``/ws`` messages of the same names: each tool is a served
verb's (`turnpool.serve.verbs`), and a call runs that verb's handler.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from turnpool.rollout.prompts import describe_env
from turnpool.serve.errors import ProtocolError
from turnpool.serve.sessions import SessionTable


class Server(Protocol):
    """What this module needs of the server (`turnpool.serve.service.Service`)."""

    settings: Any
    sessions: SessionTable

    async def reset(self, session: Any, data: dict[str, Any]) -> dict[str, Any]: ...


class ToolVerb(Protocol):
    """What this module needs of a served verb (`turnpool.serve.verbs.Verb`)."""

    @property
    def reply(self) -> str | None: ...

    @property
    def parse(self) -> Callable[[Any], Any]: ...

    @property
    def run(self) -> Callable[[Any, Any, Any], Awaitable[Any]]: ...

    @property
    def mcp_stateless(self) -> bool: ...

    @property
    def mcp_episode_first(self) -> bool: ...


#: Every tool by name, with the verb it calls, in listing order (`turnpool.serve.verbs`).
Calls = Mapping[str, tuple[ToolVerb, "Tool"]]

#: JSON-RPC 2.0 error codes
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
SERVER_ERROR = -32000

_NOT_NAME = re.compile(r"[^a-z0-9_]")
#: A tool call's result text, by the reply kind of its verb (`turnpool.serve.verbs.Verb`).
REPLY_TEXT: dict[str, Callable[[dict[str, Any]], str]] = {
    "observation": lambda data: data["observation"]["text"],
    "fork": lambda data: data["observation"]["text"],
    "snapshot": lambda data: json.dumps(data["snapshot"]),
}
#: A tool call's value (an MCP result's ``data``), by the reply kind of its verb: what an
#: OpenEnv MCP env's tool returns, not turnpool's whole payload.
REPLY_VALUE: dict[str, Callable[[dict[str, Any]], Any]] = {
    "observation": lambda data: data["observation"]["text"],
    "fork": lambda data: data["session_id"],
    "snapshot": lambda data: data["snapshot"],
}


def rpc_result(result: Any, request_id: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "result": result, "id": request_id}


def rpc_error(code: int, message: str, request_id: Any = None,
              data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "error": error, "id": request_id}


@dataclass(frozen=True)
class Tool:
    """One MCP tool of a served verb (`turnpool.serve.verbs.Verb.tools`): ``schema`` is its
    ``inputSchema``; ``fixed`` the verb's data for a tool that takes no arguments (an env
    action's tool), else the call's arguments are the data."""

    name: str
    description: str
    schema: dict[str, Any]
    fixed: dict[str, Any] | None = None

    def listing(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description,
                "inputSchema": self.schema}

    def data(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The verb's data for a call with ``arguments``, checked against the schema."""
        props = list(self.schema.get("properties", {}))
        required = self.schema.get("required", [])
        if not props:
            if arguments:
                raise ProtocolError("VALIDATION_ERROR", f"{self.name} takes no arguments")
        elif required == props and len(props) == 1:
            if set(arguments) != set(props):
                raise ProtocolError("VALIDATION_ERROR",
                                    f"{self.name} takes one argument, '{props[0]}'")
        elif set(arguments) - set(props):
            raise ProtocolError("VALIDATION_ERROR", f"{self.name} takes only "
                                + ", ".join(f"'{p}'" for p in props))
        return arguments if self.fixed is None else dict(self.fixed)


class Tools:
    """What one env as configured offers as tools: its action names (``action_names``; an
    env action's tool is `tool_name` of it) and its instruction. Which tools there are is
    the served verbs' (`turnpool.serve.verbs.tool_calls`)."""

    def __init__(self, env: str, env_kwargs: dict[str, Any]) -> None:
        desc = describe_env(env, env_kwargs)
        names: tuple[str, ...] = ()
        if desc.action_lookup:
            names = tuple(desc.action_lookup[k] for k in sorted(desc.action_lookup))
        elif desc.episode_action_names:
            names = desc.episode_action_names
        self.instruction = desc.instruction
        self.action_names = names


def tool_name(action: Any) -> str:
    """An env action's tool name: lower-cased, anything but letters, digits and ``_`` made
    ``_`` (empty: the action has no tool of its own)."""
    return _NOT_NAME.sub("_", str(action).lower())


async def handle(server: Server, calls: Calls, request: Any,
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
            return rpc_result({"tools": [tool.listing() for _, tool in calls.values()]},
                              request_id)
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
            return rpc_result(await _call(server, calls, params, session), request_id)
        return rpc_error(METHOD_NOT_FOUND, f"Method not found: {method}", request_id)
    except ProtocolError as exc:
        code = INVALID_PARAMS if exc.code in ("VALIDATION_ERROR", "SESSION_ERROR") \
            else SERVER_ERROR
        return rpc_error(code, exc.message, request_id, exc.data())


async def _call(server: Server, calls: Calls, params: dict[str, Any],
                session: Any) -> dict[str, Any]:
    """A ``tools/call``'s MCP result (`call_tool` with the call's parameters)."""
    name = params.get("name")
    arguments = params.get("arguments") or {}
    if not isinstance(name, str) or not isinstance(arguments, dict):
        raise ProtocolError("VALIDATION_ERROR", "tools/call needs 'name' and an object of "
                            "'arguments'")
    reply, out = await call_tool(server, calls, name, arguments, session,
                                 params.get("session_id"))
    return result(reply, out)


async def call_tool(server: Server, calls: Calls, name: str, arguments: dict[str, Any],
                    session: Any, session_id: Any = None) -> tuple[str, dict[str, Any]]:
    """Call tool ``name``: its verb on the call's session (`_session_of`), or, for a
    stateless verb called without one, on a slot for this call alone. The verb's reply
    kind and the handler's value (`result` makes it an MCP result)."""
    if name not in calls:
        raise ProtocolError("VALIDATION_ERROR", f"Tool not found: {name}")
    verb, tool = calls[name]
    stateless = verb.mcp_stateless and session is None and session_id is None
    own = server.sessions.open("once") if stateless else \
        _session_of(server, session_id, session)
    try:
        data = verb.parse(tool.data(arguments))
        if verb.mcp_episode_first and not own.started:  # a session with no episode starts one
            await server.reset(own, {})
        out = await verb.run(server, own, data)
    finally:
        if stateless:
            server.sessions.close(own)
    assert verb.reply is not None
    return verb.reply, out


def _session_of(server: Server, session_id: Any, session: Any) -> Any:
    """The session a call is for: the WebSocket's own, else ``session_id``'s."""
    if session is not None:
        return session
    if session_id is None:
        raise ProtocolError("SESSION_ERROR", "this tool needs a session: call it on a "
                            "WebSocket, or with a session_id (openenv/session/create)")
    own = server.sessions.get(str(session_id))
    if own is None:
        raise ProtocolError("SESSION_ERROR", f"Unknown session_id: {session_id}")
    return own


def result(reply: str, out: dict[str, Any]) -> dict[str, Any]:
    """The MCP result of a tool call whose verb replied ``reply`` with ``out``: the text as
    ``content``, the tool's value (`REPLY_VALUE`) as ``data`` (what OpenEnv's
    ``MCPToolClient.call_tool`` returns), the whole payload (reward, done, info, metadata)
    as ``structuredContent``."""
    return {"content": [{"type": "text", "text": REPLY_TEXT[reply](out)}],
            "structuredContent": out, "isError": False, "data": REPLY_VALUE[reply](out)}


#: An OpenEnv MCP action's reply when it changes no episode (OpenEnv's defaults).
_NO_TURN: dict[str, Any] = {"reward": None, "done": False}


async def step_action(server: Server, calls: Calls, action: dict[str, Any],
                      session: Any) -> dict[str, Any]:
    """OpenEnv's MCP actions through ``step`` on ``session``: ``{"type": "list_tools"}``
    answers its ``ListToolsObservation`` (``observation.tools``); ``{"type": "call_tool",
    "tool_name", "arguments"}`` its ``CallToolObservation`` (``observation.tool_name``,
    ``.result``: the MCP result, whose ``data`` is the tool's value, ``.error``: a tool
    not found or arguments refused), with the turn's ``reward`` and ``done`` beside the
    observation, where OpenEnv puts a step's. A failed env turn stays an error reply."""
    kind = action.get("type")
    fields = {"list_tools": {"type", "metadata"},
              "call_tool": {"type", "tool_name", "arguments", "metadata"}}.get(str(kind))
    if fields is None:
        raise ProtocolError("VALIDATION_ERROR", f"unknown action type {str(kind)[:40]!r} "
                            "(list_tools or call_tool)")
    if set(action) - fields:
        raise ProtocolError("VALIDATION_ERROR",
                            f"unknown action fields: {sorted(set(action) - fields)[:5]}")
    if kind == "list_tools":
        tools = [{"name": tool.name, "description": tool.description,
                  "input_schema": tool.schema} for _, tool in calls.values()]
        return {"observation": {"tools": tools, "metadata": {}}, **_NO_TURN, "metadata": {}}
    name, arguments = action.get("tool_name"), action.get("arguments") or {}
    if not isinstance(name, str) or not isinstance(arguments, dict):
        raise ProtocolError("VALIDATION_ERROR", "call_tool needs a 'tool_name' and an "
                            "object of 'arguments'")
    try:
        if name not in calls:
            raise ProtocolError("VALIDATION_ERROR", f"Tool not found: {name}")
        calls[name][1].data(arguments)
    except ProtocolError as exc:  # OpenEnv answers these as the observation's error
        error = {"error_type": "tool_not_found" if name not in calls else "invalid_args",
                 "message": exc.message}
        return {"observation": {"tool_name": name, "result": None, "error": error,
                                "metadata": {}}, **_NO_TURN, "metadata": {}}
    reply, out = await call_tool(server, calls, name, arguments, session)
    meta = out.get("metadata", {})
    return {"observation": {"tool_name": name, "result": result(reply, out), "error": None,
                            "metadata": meta},
            "reward": out.get("reward"), "done": bool(out.get("done", False)),
            "metadata": meta}
