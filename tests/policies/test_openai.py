"""The OpenAI-compatible policy against real servers on 127.0.0.1: ``transformers serve`` with
the tiny model, and a small stdlib HTTP server that stalls, fails or misbehaves on demand."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from turnpool.policies import make_policy
from turnpool.policies.base import FailedReply, PolicyUnreachable
from turnpool.policies.hf import HFPolicy
from turnpool.policies.openai import OpenAIPolicy, PolicyRequestError
from turnpool.policies.tiny_llm import sample_conversations, transformers_server
from turnpool.rollout.projection import parse_response

pytestmark = pytest.mark.timeout(180)


def prompts(n: int, seed: int = 0) -> list[list[dict[str, str]]]:
    return sample_conversations(n, seed=seed, turns=3)


# ------------------------------------------------------------------ transformers serve
@pytest.fixture(scope="module")
def served_model(tiny_model_dir: Path) -> Iterator[str]:
    with transformers_server(tiny_model_dir) as base_url:
        yield base_url


def test_openai_policy_against_transformers_serve(served_model: str,
                                                  tiny_model_dir: Path) -> None:
    policy = make_policy({"name": "openai", "base_url": served_model, "max_tokens": 32,
                          "temperature": 0.0, "concurrency": 4, "timeout": 60})
    assert isinstance(policy, OpenAIPolicy)
    batch = prompts(8)
    try:
        replies = policy.generate(batch)
    finally:
        policy.close()
    assert policy.stats.failures == 0 and policy.stats.requests == 8
    assert all(parse_response(r, max_actions=1).format_valid for r in replies), replies
    # Same weights, same template, greedy: the server says what the local policy says
    # (rows are unpadded there, so a near-tie could flip; allow two).
    local = HFPolicy(model_path=str(tiny_model_dir), max_new_tokens=32).generate(batch)
    assert sum(a == b for a, b in zip(replies, local)) >= 6, (replies, local)


# ------------------------------------------------------------------ a misbehaving server
class FakeLLM:
    """State shared by the handler threads of the stdlib server."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.release = threading.Event()  # set at teardown: stalled handlers return
        self.peak_reached = threading.Condition(self.lock)
        self.in_flight = 0
        self.peak = 0
        self.hits: Counter[str] = Counter()
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []


def make_handler(state: FakeLLM) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
            pass

        def _send(self, status: int, payload: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            mode = self.path.strip("/").split("/")[0]
            key = body["messages"][-1]["content"]
            with state.lock:
                state.hits[f"{mode}:{key}"] += 1
                attempt = state.hits[f"{mode}:{key}"]
                state.bodies.append(body)
                state.headers.append(dict(self.headers))
            ok = json.dumps({"choices": [{"message": {"role": "assistant",
                                                      "content": f"echo {key}"}}]}).encode()
            if mode == "stall":
                state.release.wait(timeout=30)
                return
            if mode == "flaky" and attempt <= 2:
                self._send(500, b'{"error": "overloaded"}')
            elif mode == "bad":
                self._send(400, b'{"error": "bad request"}')
            elif mode == "garbage":
                self._send(200, b"<html>not json</html>")
            elif mode == "huge":
                self._send(200, b"x" * 300_000)
            elif mode == "null":
                self._send(200, b'{"choices": [{"message": {"content": null}}]}')
            elif mode == "gate":
                with state.peak_reached:
                    state.in_flight += 1
                    state.peak = max(state.peak, state.in_flight)
                    state.peak_reached.notify_all()
                    state.peak_reached.wait_for(lambda: state.peak >= 3, timeout=10)
                    state.in_flight -= 1
                self._send(200, ok)
            else:
                self._send(200, ok)

    return Handler


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # The client hangs up on purpose in some tests (oversized body, timeouts).
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


@pytest.fixture()
def fake_llm() -> Iterator[tuple[str, FakeLLM]]:
    state = FakeLLM()
    server = QuietServer(("127.0.0.1", 0), make_handler(state))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def conversations(n: int, tag: str = "q") -> list[list[dict[str, str]]]:
    return [[{"role": "system", "content": "sys"}, {"role": "user", "content": f"{tag}{i}"}]
            for i in range(n)]


def test_requests_carry_the_configured_fields(fake_llm: tuple[str, FakeLLM]) -> None:
    url, state = fake_llm
    with OpenAIPolicy(f"{url}/ok/v1", api_key="secret", max_tokens=17, temperature=0.5,
                      seed=3, extra_body={"top_k": 5}) as policy:
        assert policy.generate(conversations(3)) == ["echo q0", "echo q1", "echo q2"]
    body = state.bodies[0]
    assert body["max_tokens"] == 17 and body["temperature"] == 0.5 and body["seed"] == 3
    assert body["top_k"] == 5 and "model" not in body and body["stream"] is False
    assert body["messages"][0] == {"role": "system", "content": "sys"}
    assert state.headers[0]["Authorization"] == "Bearer secret"
    with OpenAIPolicy(f"{url}/ok/v1", model="m") as policy:
        policy.generate(conversations(1))
    assert state.bodies[-1]["model"] == "m"


def test_concurrency_limit_is_reached_and_never_exceeded(fake_llm: tuple[str, FakeLLM]) -> None:
    url, state = fake_llm
    with OpenAIPolicy(f"{url}/gate/v1", concurrency=3, timeout=30) as policy:
        replies = policy.generate(conversations(9))
    assert replies == [f"echo q{i}" for i in range(9)]
    assert state.peak == 3


def test_stalled_server_times_out_retries_and_returns_empty(
        fake_llm: tuple[str, FakeLLM]) -> None:
    url, state = fake_llm
    with OpenAIPolicy(f"{url}/stall/v1", concurrency=4, timeout=0.3, max_retries=1,
                      backoff=0.01) as policy:
        replies = policy.generate(conversations(4))
        assert replies == [""] * 4
        stats = policy.stats
        assert stats.failures == 4 and stats.retries == 4 and stats.timeouts == 8
        assert stats.requests == 8
        assert all(state.hits[f"stall:q{i}"] == 2 for i in range(4))


def test_total_deadline_bounds_a_call(fake_llm: tuple[str, FakeLLM]) -> None:
    url, _ = fake_llm
    with OpenAIPolicy(f"{url}/stall/v1", concurrency=2, timeout=20, max_retries=5,
                      deadline=0.5) as policy:
        start = time.monotonic()
        replies = policy.generate(conversations(4))
        elapsed = time.monotonic() - start
    assert replies == [""] * 4
    assert elapsed < 15  # a generous bound: without the deadline this takes minutes


def test_server_errors_are_retried_with_backoff(fake_llm: tuple[str, FakeLLM]) -> None:
    url, state = fake_llm
    with OpenAIPolicy(f"{url}/flaky/v1", max_retries=2, backoff=0.01) as policy:
        assert policy.generate(conversations(3)) == ["echo q0", "echo q1", "echo q2"]
        assert policy.stats.retries == 6 and policy.stats.failures == 0
    with OpenAIPolicy(f"{url}/flaky/v1", max_retries=1, backoff=0.01) as policy:
        assert policy.generate(conversations(2, tag="z")) == ["", ""]
        assert policy.stats.failures == 2
        assert "HTTP 500" in policy.stats.errors[0]
    assert state.hits["flaky:z0"] == 2


@pytest.mark.parametrize("mode", ["bad", "garbage", "huge"])
def test_permanent_errors_are_not_retried(fake_llm: tuple[str, FakeLLM], mode: str) -> None:
    url, state = fake_llm
    with OpenAIPolicy(f"{url}/{mode}/v1", max_retries=3, backoff=0.01,
                      max_body_bytes=100_000) as policy:
        assert policy.generate(conversations(2)) == ["", ""]
        assert policy.stats.failures == 2 and policy.stats.retries == 0
    assert state.hits[f"{mode}:q0"] == 1


def test_null_content_is_an_empty_reply_and_long_replies_are_cut(
        fake_llm: tuple[str, FakeLLM]) -> None:
    url, _ = fake_llm
    with OpenAIPolicy(f"{url}/null/v1") as policy:
        assert policy.generate(conversations(1)) == [""]
        assert policy.stats.failures == 0
    with OpenAIPolicy(f"{url}/ok/v1", max_response_chars=4) as policy:
        assert policy.generate(conversations(1)) == ["echo"]


def test_on_error_raise_and_close(fake_llm: tuple[str, FakeLLM]) -> None:
    url, _ = fake_llm
    policy = OpenAIPolicy(f"{url}/bad/v1", on_error="raise")
    with pytest.raises(PolicyRequestError, match="HTTP 400"):
        policy.generate(conversations(2))
    policy.close()
    policy.close()
    with pytest.raises(RuntimeError, match="closed"):
        policy.generate(conversations(1))
    assert policy.generate([]) == []
    with pytest.raises(ValueError, match="on_error"):
        OpenAIPolicy(url, on_error="ignore")


def test_unreachable_server_fails_fast_and_cleanly() -> None:
    from turnpool.policies.tiny_llm import free_port

    url = f"http://127.0.0.1:{free_port()}/v1"
    with OpenAIPolicy(url, max_retries=1, backoff=0.01, timeout=2) as policy:
        start = time.monotonic()
        with pytest.raises(PolicyUnreachable) as info:
            policy.generate(conversations(2))
        assert time.monotonic() - start < 10  # bounded: two attempts, short backoff
        assert f"{url}/chat/completions" in str(info.value) and "2 attempt" in str(info.value)
        assert policy.stats.failures == 2 and policy.stats.retries == 2
        assert "Connect" in policy.stats.errors[0]


def test_failed_replies_say_why(fake_llm: tuple[str, FakeLLM]) -> None:
    """A request that fails (the server answers, badly) gives an empty `FailedReply` with the
    reason, which the collector records as a policy_error; good replies are plain text."""
    url, _ = fake_llm
    with OpenAIPolicy(f"{url}/bad/v1", max_retries=0) as policy:
        replies = policy.generate(conversations(2))
    assert replies == ["", ""] and all(isinstance(r, FailedReply) for r in replies)
    assert "HTTP 400" in replies[0].error
    with OpenAIPolicy(f"{url}/ok/v1") as policy:
        reply = policy.generate(conversations(1))[0]
    assert reply == "echo q0" and not isinstance(reply, FailedReply)


# ------------------------------------------------------------------ a full rollout
def test_full_rollout_through_the_openai_policy(served_model: str, tmp_path: Path) -> None:
    from turnpool.ragen.rollout_manager import collector_from_config
    from turnpool.rollout.trajectory import read_jsonl

    overrides = ["es_manager.train.env_groups=2", "es_manager.train.group_size=2",
                 "es_manager.train.env_configs.tags=[SimpleSokoban]",
                 "es_manager.train.env_configs.n_groups=[2]", "agent_proxy.max_turn=3",
                 "turnpool.backend=sequential",
                 f"turnpool.policy={{name: openai, base_url: '{served_model}', "
                 f"max_tokens: 48, concurrency: 4, timeout: 60}}"]
    with collector_from_config(overrides=overrides) as collector:
        policy = collector.policy
        assert isinstance(policy, OpenAIPolicy)
        batch = collector.collect(seed=3)
    assert batch.to_jsonl(tmp_path / "out.jsonl") == 4
    assert [t.to_dict() for t in read_jsonl(tmp_path / "out.jsonl")] == \
        [t.to_dict() for t in batch.trajectories]
    turns = [turn for traj in batch.trajectories for turn in traj.turns]
    assert policy.stats.failures == 0 and policy.stats.requests == len(turns)
    assert all(turn.llm_raw_response for turn in turns)  # every request got a real reply
    for traj in batch.trajectories:
        replies = [m["content"] for m in traj.messages if m["role"] == "assistant"]
        assert replies == [turn.llm_response for turn in traj.turns]
    assert batch.metrics["SimpleSokoban/valid_action_ratio"] > 0.5
    assert batch.metrics["env_steps"] >= 4


def test_a_misspelled_policy_option_names_the_intended_one() -> None:
    with pytest.raises(TypeError, match="'base_ur' \\(did you mean 'base_url'\\?\\)"):
        make_policy({"name": "openai", "base_ur": "http://127.0.0.1:1/v1"})
    with pytest.raises(ValueError, match="timeout"):
        make_policy({"name": "openai", "base_url": "http://127.0.0.1:1/v1", "timeout": -1})
