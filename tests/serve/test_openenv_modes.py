"""OpenEnv's simulation mode and MCP actions on ``turnpool serve``: HTTP ``POST /step``
without a session steps a fresh env from the request's seed and holds nothing; OpenEnv's
``call_tool`` / ``list_tools`` actions work through HTTP ``/step`` and ``/ws`` ``step``,
answered as OpenEnv's MCP observations with the turn's reward and done; a WebSocket on
``/mcp`` speaks JSON-RPC over its own session; an MCP tool call's value is the tool's;
production mode serves no HTTP simulation controls."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openenv.core.env_server.mcp_types import CallToolObservation, ListToolsObservation
from openenv.core.env_server.types import StepResponse
from openenv.core.mcp_client import MCPToolClient
from websockets.sync.client import ClientConnection, connect

import turnpool
from turnpool.serve import ServeSettings, TurnpoolServer
from turnpool.serve.mcp import Tools
from turnpool.serve.verbs import tool_calls

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def server() -> Iterator[TurnpoolServer]:
    settings = ServeSettings(env="sokoban", max_sessions=4, max_http_sessions=2,
                             backend="sequential")
    with TurnpoolServer(settings) as srv:
        yield srv


def _active(url: str) -> int:
    count: int = httpx.get(url + "/api/status", timeout=30).json()["active_sessions"]
    return count


def _until_no_sessions(url: str) -> None:
    """Wait (30 s at most) until the server holds no session: a closed socket's session is
    released when the server reads the close."""
    deadline = time.monotonic() + 30
    while _active(url):
        assert time.monotonic() < deadline, "the sessions were not released"
        time.sleep(0.05)


def _ask(ws: ClientConnection, message: dict[str, Any]) -> dict[str, Any]:
    ws.send(json.dumps(message))
    reply: dict[str, Any] = json.loads(ws.recv(timeout=60))
    return reply


def test_a_sessionless_step_steps_a_fresh_env_from_its_seed(server: TurnpoolServer) -> None:
    env = turnpool.make("sokoban")
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for seed in (4, 9, 4, 9, 4, 9):  # twice the slots: each call releases its own
            env.reset(seed=seed)
            obs, reward, terminated, _, _ = env.step("Left")
            reply = http.post("/step", json={"action": {"action": "Left"}, "seed": seed})
            assert reply.status_code == 200, reply.text
            out = StepResponse.model_validate(reply.json())  # OpenEnv's own model
            assert out.observation["text"] == obs
            assert (out.reward, out.done) == (reward, terminated)
            assert out.observation["metadata"]["seed"] == seed
            assert out.observation["metadata"]["session_id"] is None
        assert http.post("/step", json={"seed": 1}).status_code == 400  # no action
    assert _active(server.url) == 0


def test_mcp_actions_through_http_step(server: TurnpoolServer) -> None:
    env = turnpool.make("sokoban")
    want = [env.reset(seed=6)[0], env.step("Down")[0]]
    names = list(tool_calls(Tools("sokoban", {})))
    with httpx.Client(base_url=server.url, timeout=30) as http:
        listed = http.post("/step", json={"action": {"type": "list_tools"}}).json()
        tools = ListToolsObservation.model_validate(listed["observation"]).tools
        assert [tool.name for tool in tools] == names
        assert tools[names.index("act")].input_schema["required"] == ["action"]
        sid = http.post("/reset", json={"seed": 6, "stateful": True}).json()["metadata"][
            "session_id"]
        called = http.post("/step", json={"session_id": sid, "action": {
            "type": "call_tool", "tool_name": "down", "arguments": {}}}).json()
        obs = CallToolObservation.model_validate(called["observation"])
        assert obs.tool_name == "down" and obs.error is None
        assert obs.result["data"] == want[1] and obs.result["content"][0]["text"] == want[1]
        assert http.get("/state", params={"session_id": sid}).json()["step_count"] == 1
        once = http.post("/step", json={"seed": 6, "action": {
            "type": "call_tool", "tool_name": "act", "arguments": {"action": "Down"}}})
        assert once.json()["observation"]["result"]["data"] == want[1]
        http.post("/close", json={"session_id": sid})
    assert _active(server.url) == 0


def test_mcp_actions_through_ws_step_carry_reward_and_done() -> None:
    env = turnpool.make("bandit")
    first, _ = env.reset(seed=3)
    obs, reward, terminated, _, _ = env.step("dragon")
    assert terminated  # one pull ends a bandit episode
    settings = ServeSettings(env="bandit", max_sessions=2, backend="sequential")
    with TurnpoolServer(settings) as srv, \
            connect(srv.url.replace("http://", "ws://") + "/ws", open_timeout=60) as ws:
        def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
            return _ask(ws, {"type": "step", "data": {
                "type": "call_tool", "tool_name": name, "arguments": arguments}})

        reset = call("reset", {"seed": 3})
        assert reset["type"] == "observation"
        assert reset["data"]["observation"]["result"]["data"] == first
        assert (reset["data"]["reward"], reset["data"]["done"]) == (None, False)
        pulled = call("dragon", {})["data"]
        assert pulled["observation"]["result"]["data"] == obs
        assert (pulled["reward"], pulled["done"]) == (reward, True)
        missing = call("jump", {})["data"]["observation"]
        assert missing["error"]["error_type"] == "tool_not_found"
        refused = call("act", {"arm": "dragon"})["data"]["observation"]
        assert refused["error"]["error_type"] == "invalid_args"
        over = call("phoenix", {})  # a turn after the end is refused, as a step is
        assert over["type"] == "error" and "episode is over" in over["data"]["message"]
        bad = _ask(ws, {"type": "step", "data": {"type": "teleport"}})
        assert bad["type"] == "error" and bad["data"]["code"] == "VALIDATION_ERROR"
        plain = _ask(ws, {"type": "reset", "data": {"seed": 3}})  # plain turns still work
        assert plain["data"]["observation"]["text"] == first
        stepped = _ask(ws, {"type": "step", "data": {"action": "dragon"}})["data"]
        assert (stepped["observation"]["text"], stepped["reward"]) == (obs, reward)


def test_a_websocket_on_mcp_speaks_json_rpc_over_its_own_session(
        server: TurnpoolServer) -> None:
    env = turnpool.make("sokoban")
    want = [env.reset(seed=8)[0], env.step("Right")[0]]
    url = server.url.replace("http://", "ws://") + "/mcp"
    with connect(url, open_timeout=60) as one, connect(url, open_timeout=60) as two:
        def call(ws: ClientConnection, name: str, arguments: dict[str, Any]) -> Any:
            reply = _ask(ws, {"jsonrpc": "2.0", "id": name, "method": "tools/call",
                              "params": {"name": name, "arguments": arguments}})
            assert reply["id"] == name, reply
            return reply["result"]["data"]

        assert call(one, "reset", {"seed": 8}) == want[0]
        assert call(two, "reset", {"seed": 1}) != want[0]
        assert call(one, "right", {}) == want[1]  # its own episode, not the other's
        sid = _ask(one, {"jsonrpc": "2.0", "id": 3, "method": "openenv/session/create"})
        assert sid["result"]["session_id"] in {
            s["id"] for s in httpx.get(server.url + "/api/status").json()["sessions"]}
        listed = _ask(two, {"jsonrpc": "2.0", "id": 4, "method": "tools/list"})
        assert [t["name"] for t in listed["result"]["tools"]][:1] == ["reset"]
        assert _ask(two, {"jsonrpc": "2.0", "id": 5, "method": "nope"})["error"]["code"] == \
            -32601
        two.send("not json")
        assert json.loads(two.recv(timeout=60))["error"]["code"] == -32700
        assert _active(server.url) == 2
        with connect(url, open_timeout=60), connect(url, open_timeout=60), \
                connect(url, open_timeout=60) as fifth:  # past the 4 slots
            refused = json.loads(fifth.recv(timeout=60))
        assert refused["error"]["code"] == -32000
        assert refused["error"]["data"]["code"] == "CAPACITY_REACHED"
    _until_no_sessions(server.url)  # each socket's session went with it


def test_mcp_tool_client_gets_each_tools_value(server: TurnpoolServer) -> None:
    env = turnpool.make("sokoban")
    want = [env.reset(seed=2)[0], env.step("Up")[0]]
    with MCPToolClient(base_url=server.url, message_timeout_s=60.0).sync() as client:
        assert client.call_tool("reset", seed=2) == want[0]
        assert client.call_tool("up") == want[1]
        snapshot = client.call_tool("snapshot")
        assert isinstance(snapshot, dict) and snapshot
        fork = client.call_tool("fork")
        assert isinstance(fork, str)
        assert fork in {s["id"] for s in httpx.get(server.url + "/api/status").json()[
            "sessions"]}
        httpx.post(server.url + "/close", json={"session_id": fork}, timeout=30)
    _until_no_sessions(server.url)


def test_production_mode_serves_no_simulation_controls_over_http() -> None:
    """OpenEnv's production mode: no HTTP /reset, /step or /state; WebSocket sessions and
    MCP tools play on."""
    with pytest.raises(ValueError, match="mode must be one of"):
        ServeSettings(mode="staging")
    env = turnpool.make("sokoban")
    want = [env.reset(seed=7)[0], env.step("Up")[0]]
    settings = ServeSettings(env="sokoban", max_sessions=2, backend="sequential",
                             mode="production")
    with TurnpoolServer(settings) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        assert http.post("/reset", json={}).status_code in (404, 405)
        assert http.post("/step", json={"action": {"action": "Up"}}).status_code in (404, 405)
        assert http.get("/state").status_code in (404, 405)
        called = http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                         "params": {"name": "reset",
                                                    "arguments": {"seed": 7}}}).json()
        assert called["result"]["data"] == want[0]
        with connect(srv.url.replace("http://", "ws://") + "/ws", open_timeout=60) as ws:
            _ask(ws, {"type": "reset", "data": {"seed": 7}})
            assert _ask(ws, {"type": "step", "data": {"action": "Up"}})["data"][
                "observation"]["text"] == want[1]
