"""The served-verb table (`turnpool.serve.verbs.VERBS`) is what every face serves: each verb
answers over ``/ws`` with its reply kind, over HTTP on its path, over MCP through each of its
tools, and, with several fronts, a request naming another front's session reaches that
front for every routed verb. A verb added to the table without a request here fails the
first test."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosedOK
from websockets.sync.client import connect

from turnpool.serve import ServeSettings, TurnpoolServer
from turnpool.serve.fronts import ROUTED_HEADER, FrontGroup
from turnpool.serve.fronts.routing import ROUTED_PATHS
from turnpool.serve.mcp import Tools
from turnpool.serve.verbs import VERBS, Verb, tool_calls

pytestmark = pytest.mark.timeout(180)

SETTINGS = ServeSettings(env="sokoban", max_sessions=32, max_http_sessions=16,
                         backend="sequential")


def _requests(snapshot: Any) -> dict[str, tuple[Any, dict[str, Any]]]:
    """Each verb's request for a session mid-episode: its ``/ws`` data and its HTTP body
    (without ``session_id``)."""
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    return {
        "reset": ({"seed": 5}, {"seed": 5}),
        "step": ({"action": "Up"}, {"action": {"action": "Up"}}),
        "state": ({}, {}),
        "fork": ({}, {}),
        "snapshot": ({}, {}),
        "restore": ({"snapshot": snapshot}, {"snapshot": snapshot}),
        "close": ({}, {}),
        "mcp": (rpc, rpc),
    }


def _last_close_last(verbs: tuple[Verb, ...]) -> list[Verb]:
    return sorted(verbs, key=lambda verb: verb.name == "close")


@pytest.fixture(scope="module")
def server() -> Iterator[TurnpoolServer]:
    with TurnpoolServer(SETTINGS) as srv:
        yield srv


def _held(client: httpx.Client) -> str:
    opened = client.post("/reset", json={"seed": 5, "stateful": True}).json()
    sid: str = opened["metadata"]["session_id"]
    return sid


def _call(client: httpx.Client, verb: Verb, sid: str, body: dict[str, Any]) -> httpx.Response:
    if verb.http_get:
        return client.get("/" + verb.name, params={"session_id": sid, **body})
    if verb.name == "mcp":
        return client.post("/mcp", json={**body, "params": {"session_id": sid}})
    return client.post("/" + verb.name, json={"session_id": sid, **body})


def test_every_verb_answers_over_ws_http_and_mcp(server: TurnpoolServer) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        snapshot = client.post("/snapshot", json={"session_id": _held(client)}).json()
        requests = _requests(snapshot["snapshot"])
        assert set(requests) == {verb.name for verb in VERBS}
        for verb in _last_close_last(VERBS):
            ws_data, body = requests[verb.name]
            with connect(server.url.replace("http://", "ws://") + "/ws",
                         open_timeout=60) as ws:
                ws.send(json.dumps({"type": "reset", "data": {"seed": 5}}))
                assert json.loads(ws.recv(timeout=60))["type"] == "observation"
                ws.send(json.dumps({"type": verb.name, "data": ws_data}))
                if verb.reply is None:  # the message ends the connection
                    with pytest.raises(ConnectionClosedOK):
                        ws.recv(timeout=60)
                else:
                    reply = json.loads(ws.recv(timeout=60))
                    assert reply["type"] == verb.reply, (verb.name, reply)
            answer = _call(client, verb, _held(client), body)
            assert answer.status_code == 200, (verb.name, answer.text)
            assert "error" not in answer.json() and "detail" not in answer.json()


def test_every_tool_listed_is_a_verbs_and_answers(server: TurnpoolServer) -> None:
    calls = tool_calls(Tools(SETTINGS.env, {}))
    with httpx.Client(base_url=server.url, timeout=30) as client:
        sid = _held(client)
        snapshot = client.post("/snapshot", json={"session_id": sid}).json()["snapshot"]
        listed = client.post("/mcp", json={"jsonrpc": "2.0", "id": 1,
                                           "method": "tools/list"}).json()
        assert [t["name"] for t in listed["result"]["tools"]] == list(calls)
        assert {verb.name for verb, _ in calls.values()} == {
            verb.name for verb in VERBS if verb.tools({}, ())}
        samples = {"seed": 5, "action": "Up", "snapshot": snapshot}
        for name, (verb, tool) in calls.items():
            arguments = {p: samples[p] for p in tool.schema.get("required", [])}
            out = client.post("/mcp", json={
                "jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": name, "arguments": arguments, "session_id": sid}}).json()
            assert "result" in out, (name, out)
            assert out["result"]["structuredContent"], (name, verb.name)


def test_every_routed_verb_reaches_the_front_holding_its_session() -> None:
    assert {"/" + verb.name for verb in VERBS if verb.routed} == ROUTED_PATHS
    settings = ServeSettings(**{**SETTINGS.__dict__, "frontends": 2})
    with FrontGroup(settings) as group:
        def front(k: int) -> httpx.Client:  # front k's own socket: no kernel choice
            transport = httpx.HTTPTransport(uds=group.specs[k].http_path(k))
            return httpx.Client(transport=transport, base_url="http://front", timeout=30)

        with front(0) as zero, front(1) as one:
            for owner, other in ((zero, one), (one, zero)):
                sid = _held(owner)
                snapshot = owner.post("/snapshot", json={"session_id": sid}).json()
                requests = _requests(snapshot["snapshot"])
                for verb in _last_close_last(VERBS):  # each names a session: routed
                    answer = _call(other, verb, sid, requests[verb.name][1])
                    assert answer.status_code == 200, (verb.name, answer.text)
                    assert ROUTED_HEADER in answer.headers, verb.name
