"""OpenEnv's own tools accept ``turnpool serve``: ``openenv validate`` passes, OpenEnv's
``MCPToolClient`` plays an exact episode through the env's actions as tools, ``/schema`` and
``/metadata`` name the actions, and the session rules a client relies on hold."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest
from openenv.core.env_server.types import EnvironmentMetadata
from openenv.core.mcp_client import MCPToolClient
from websockets.sync.client import connect

import turnpool
from tests.serve.conftest import openenv_validate
from turnpool.serve import ServeSettings, TurnpoolServer

pytestmark = pytest.mark.timeout(180)

TOKEN = "s3cret"


@pytest.fixture(scope="module")
def server() -> Iterator[TurnpoolServer]:
    settings = ServeSettings(env="sokoban", max_sessions=4, backend="sequential")
    with TurnpoolServer(settings) as srv:
        yield srv


def test_openenv_validate_passes(server: TurnpoolServer) -> None:
    openenv_validate(server.url)


def test_mcp_tool_client_plays_an_exact_episode(server: TurnpoolServer) -> None:
    env = turnpool.make("sokoban")
    want = [env.reset(seed=11)[0]] + [env.step(a)[0] for a in (1, 3, 2, 4, 1)]
    client = MCPToolClient(base_url=server.url, message_timeout_s=60.0).sync()
    with client:
        names = [t.name for t in client.list_tools()]
        assert names[:1] == ["reset"] and {"up", "down", "left", "right", "act"} <= set(names)
        # a tool's value, as an OpenEnv MCP env's tool returns it: the observation text
        got = [client.call_tool("reset", seed=11)]
        for tool in ("up", "left", "down", "right"):
            got.append(client.call_tool(tool))
        got.append(client.call_tool("act", action="Up"))
        with pytest.raises(RuntimeError, match="Tool not found"):
            client.call_tool("jump")
    assert got == want
    status = httpx.get(server.url + "/api/status", timeout=30).json()
    assert status["active_sessions"] == 0  # the client's close freed its slot


def test_the_websocket_mcp_message_steps_the_sessions_env(server: TurnpoolServer) -> None:
    env = turnpool.make("sokoban")
    want = [env.reset(seed=5)[0], env.step(2)[0]]
    with connect(server.url.replace("http://", "ws://") + "/ws", open_timeout=30) as ws:
        got = []
        for name, args in (("reset", {"seed": 5}), ("down", {})):
            ws.send(json.dumps({"type": "mcp", "data": {
                "jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": name, "arguments": args}}}))
            reply = json.loads(ws.recv(timeout=60))
            assert reply["type"] == "mcp" and reply["data"]["id"] == 1
            got.append(reply["data"]["result"]["content"][0]["text"])
    assert got == want


def test_schema_and_metadata_name_the_actions(server: TurnpoolServer) -> None:
    schema = httpx.get(server.url + "/schema", timeout=30).json()
    enum = schema["action"]["properties"]["action"]["anyOf"][0]["enum"]
    assert enum == ["Up", "Down", "Left", "Right"]
    meta = EnvironmentMetadata.model_validate(
        httpx.get(server.url + "/metadata", timeout=30).json())  # OpenEnv's own model
    assert meta.version == turnpool.__version__ and meta.readme_content
    assert "## Instruction" in meta.readme_content
    assert "names: Up, Down, Left, Right" in meta.readme_content
    assert "reset, up, down, left, right, act" in meta.readme_content


def test_an_unknown_session_id_is_a_session_error(server: TurnpoolServer) -> None:
    with connect(server.url.replace("http://", "ws://") + "/ws?session_id=nope",
                 open_timeout=30) as ws:
        reply = json.loads(ws.recv(timeout=30))
    assert reply["type"] == "error" and reply["data"]["code"] == "SESSION_ERROR"
    rpc = httpx.post(server.url + "/mcp", timeout=30, json={
        "jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "up", "arguments": {}, "session_id": "nope"}}).json()
    assert rpc["id"] == 7 and "Unknown session_id" in rpc["error"]["message"]


def test_health_is_open_without_the_token_and_the_rest_is_not() -> None:
    settings = ServeSettings(env="trivial", max_sessions=2, backend="sequential")
    with TurnpoolServer(settings, token=TOKEN) as srv:
        assert httpx.get(srv.url + "/health", timeout=30).json() == {"status": "healthy"}
        assert httpx.get(srv.url + "/schema", timeout=30).status_code == 401
        assert httpx.post(srv.url + "/mcp", json={}, timeout=30).status_code == 401
        headers = {"Authorization": f"Bearer {TOKEN}"}
        assert httpx.get(srv.url + "/schema", headers=headers, timeout=30).status_code == 200


def test_http_reset_is_stateless_unless_a_session_is_asked_for() -> None:
    """OpenEnv's HTTP reset holds nothing: many of them never fill the server; held HTTP/MCP
    sessions are opt-in, capped, and reaped when idle, while WebSocket sessions are not."""
    from openenv.core.env_server.types import ResetResponse

    from tests.serve.conftest import client

    settings = ServeSettings(env="sokoban", max_sessions=3, backend="sequential",
                             max_http_sessions=1, http_session_timeout=0.5)
    assert ServeSettings().session_timeout is None  # idle WebSocket sessions live on
    want, _ = turnpool.make("sokoban").reset(seed=4)
    with TurnpoolServer(settings) as srv, httpx.Client(base_url=srv.url, timeout=30) as http, \
            client(srv.url) as ws_env:
        ws_env.reset(seed=1)
        for _ in range(12):  # four times the slots
            reply = ResetResponse.model_validate(http.post("/reset", json={"seed": 4}).json())
            assert reply.observation["text"] == want
            assert reply.metadata["session_id"] is None
        held = http.post("/reset", json={"stateful": True}).json()["metadata"]["session_id"]
        refused = http.post("/reset", json={"stateful": True})
        assert refused.status_code == 503 and "max_http_sessions" in refused.text
        mcp_refused = http.post("/mcp", json={"jsonrpc": "2.0", "id": 1,
                                              "method": "openenv/session/create"}).json()
        assert "max_http_sessions" in mcp_refused["error"]["message"]
        with client(srv.url) as another:  # WebSockets are never locked out by HTTP
            assert another.reset(seed=4).observation["text"] == want
        # the held HTTP session is reaped when idle; the idle WebSocket session is not
        deadline = time.monotonic() + 30
        while held in {s["id"] for s in httpx.get(srv.url + "/api/status").json()["sessions"]}:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        gone = http.post("/step", json={"session_id": held, "action": {"action": "Up"}})
        assert gone.status_code == 404 and gone.json()["detail"]["code"] == "SESSION_ERROR"
        assert ws_env.step({"action": "Up"}).observation["text"]
