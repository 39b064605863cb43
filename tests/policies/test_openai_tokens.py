"""Token ids from an OpenAI-compatible server that returns them (vLLM's ``return_token_ids``):
a loopback HTTP server answering in vLLM's format stands in for vLLM, which cannot run here."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from turnpool.policies.openai import OpenAIPolicy
from turnpool.pool import EnvPool
from turnpool.rollout.collector import TrajectoryCollector
from turnpool.rollout.settings import CollectorSettings

REPLY = "<think>high arm</think><answer>dragon</answer>"


class Handler(BaseHTTPRequestHandler):
    bodies: list[dict[str, Any]] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Handler.bodies.append(body)
        n = len(body["messages"][-1]["content"])
        payload: dict[str, Any] = {"choices": [{"message": {"content": REPLY}}]}
        if body.get("return_token_ids"):
            payload["prompt_token_ids"] = list(range(n % 50 + 3))
            payload["choices"][0]["token_ids"] = [7, 8, 9]
            payload["choices"][0]["logprobs"] = {"content": [
                {"token": "a", "logprob": -0.5}, {"token": "b", "logprob": -0.25},
                {"token": "c", "logprob": -1.0}]}
        raw = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


@pytest.fixture()
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


@pytest.mark.parametrize("ask", [True, False])
def test_server_token_ids_reach_the_trajectory(server: str, ask: bool) -> None:
    Handler.bodies.clear()
    policy = OpenAIPolicy(base_url=server, return_token_ids=ask)
    pool = EnvPool("bandit", env_num=1, group_n=2, backend="sequential")
    with TrajectoryCollector(pool, policy, settings=CollectorSettings(max_turn=1),
                             owns_pool=True, owns_policy=True) as col:
        batch = col.collect()
    assert all(("return_token_ids" in b) is ask for b in Handler.bodies)
    for t in batch.trajectories:
        assert t.turns[0].llm_raw_response == REPLY and t.success
        if ask:
            view = t.token_view()
            assert view.response_ids == [7, 8, 9] and view.loss_mask == [1, 1, 1]
            assert view.logprobs == [-0.5, -0.25, -1.0] and len(view.prompt_ids) >= 3
            assert t.turns[0].prompt_extends is False
        else:
            assert not t.has_tokens
