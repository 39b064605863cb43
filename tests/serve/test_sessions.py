"""Sessions of ``turnpool serve``: the concurrency cap answers "busy" at once, idle sessions
are reaped, seeds and episode ids are honoured, hostile messages are refused, a token guards
a shared server, the steps of many sessions share pool calls, and the CLI process leaves no
worker behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psutil
import pytest
from click.testing import CliRunner
from websockets.sync.client import connect

import turnpool
from tests.faults import wait_gone
from tests.serve.conftest import client
from turnpool.cli import main
from turnpool.serve import ServeSettings, TurnpoolServer

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def server() -> Iterator[TurnpoolServer]:
    settings = ServeSettings(env="sokoban", max_sessions=3, backend="process", num_workers=2,
                             session_timeout=60.0, max_http_sessions=3)
    with TurnpoolServer(settings) as srv:
        yield srv


def _raw(url: str, **kwargs: Any) -> Any:
    return connect(url.replace("http://", "ws://") + "/ws", open_timeout=30, **kwargs)


def _ask(ws: Any, message: Any) -> dict[str, Any]:
    ws.send(message if isinstance(message, str) else json.dumps(message))
    reply: dict[str, Any] = json.loads(ws.recv(timeout=60))
    return reply


def _status(url: str, **kwargs: Any) -> dict[str, Any]:
    out: dict[str, Any] = httpx.get(url + "/api/status", timeout=30, **kwargs).json()
    return out


def test_the_cap_answers_busy_and_frees_on_close(server: TurnpoolServer) -> None:
    held = [client(server.url) for _ in range(3)]
    try:
        for env in held:
            env.reset(seed=1)
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="CAPACITY_REACHED") as err:
            client(server.url).reset()
        assert "busy" in str(err.value)
        assert time.monotonic() - t0 < 30  # answered, not queued
        reply = httpx.post(server.url + "/reset", json={}, timeout=30)
        assert reply.status_code == 503 and "busy" in reply.json()["detail"]["message"]
        held.pop().close()
        with client(server.url) as again:  # the freed slot serves a new session
            assert again.reset(seed=2).observation["text"]
    finally:
        for env in held:
            env.close()
    assert _status(server.url)["refused_sessions"] >= 2


def test_http_busy_is_503(server: TurnpoolServer) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        sids = [http.post("/reset", json={"stateful": True}).json()["metadata"]["session_id"]
                for _ in range(3)]
        reply = http.post("/reset", json={"stateful": True})
        assert reply.status_code == 503
        assert reply.json()["detail"]["code"] == "CAPACITY_REACHED"
        for sid in sids:
            assert http.post("/close", json={"session_id": sid}).status_code == 200
        assert http.post("/step", json={"action": {"action": "Up"}, "session_id": sids[0]}
                         ).status_code == 404


def test_seedless_resets_report_their_seed_and_replay(server: TurnpoolServer) -> None:
    with client(server.url) as env:
        first = env.reset()
        seed = first.metadata["seed"]
        assert isinstance(seed, int)
        second = env.reset()
        assert second.metadata["seed"] != seed  # the pool's schedule never repeats a seed
        again = env.reset(seed=seed)
    want, _ = turnpool.make("sokoban").reset(seed=seed)
    assert first.observation["text"] == again.observation["text"] == want


def test_episode_id_and_state(server: TurnpoolServer) -> None:
    with client(server.url) as env:
        env.reset(seed=4, episode_id="my-episode")
        env.step({"actions": ["Up", "Left"]})
        state = env.state()
        assert state["episode_id"] == "my-episode" and state["step_count"] == 2
        env.reset(seed=4)
        assert env.state()["episode_id"] not in (None, "my-episode")


def test_hostile_messages_are_refused(server: TurnpoolServer) -> None:
    with _raw(server.url) as ws:
        assert _ask(ws, "{not json")["data"]["code"] == "INVALID_JSON"
        assert _ask(ws, {"type": "dance"})["data"]["code"] == "UNKNOWN_TYPE"
        step_first = _ask(ws, {"type": "step", "data": {"action": "Up"}})
        assert step_first["type"] == "error" and "reset" in step_first["data"]["message"]
        assert _ask(ws, {"type": "reset", "data": {"seed": -1}})["type"] == "error"
        assert _ask(ws, {"type": "reset", "data": {"seed": 3}})["type"] == "observation"
        for bad in ({"action": "x" * 20_000}, {"action": [1]}, {"actions": []},
                    {"action": True}, {"code": "import os"}, "Up"):
            reply = _ask(ws, {"type": "step", "data": bad})
            assert reply["data"]["code"] == "VALIDATION_ERROR", bad
        # an action the env does not know is a valid step with action_is_valid False
        reply = _ask(ws, {"type": "step", "data": {"action": "__import__('os')"}})
        assert reply["type"] == "observation"
        assert reply["data"]["observation"]["info"]["action_is_valid"] is False
        assert _ask(ws, {"type": "state"})["data"]["step_count"] == 1


def test_schema_health_metadata(server: TurnpoolServer) -> None:
    from openenv.core.env_server.types import (
        EnvironmentMetadata,
        HealthResponse,
        SchemaResponse,
    )

    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert HealthResponse.model_validate(http.get("/health").json()).status == "healthy"
        meta = EnvironmentMetadata.model_validate(http.get("/metadata").json())
        assert meta.name == "sokoban"
        schema = SchemaResponse.model_validate(http.get("/schema").json())
        assert "action" in schema.action["properties"]
        assert "text" in schema.observation["properties"]


def test_many_sessions_share_pool_calls() -> None:
    settings = ServeSettings(env="sleep", env_kwargs={"sleep_ms": 20.0}, max_sessions=16,
                             backend="process", num_workers=2)
    with TurnpoolServer(settings) as srv:
        def run(k: int) -> int:
            with client(srv.url) as env:
                env.reset(seed=k)
                for _ in range(10):
                    env.step({"action": "a"})
                return int(env.state()["step_count"])

        with ThreadPoolExecutor(16) as ex:
            assert list(ex.map(run, range(16))) == [10] * 16
        status = _status(srv.url)
    assert status["steps_total"] == 160
    # 160 steps of 16 concurrent sessions travelled in far fewer pool calls
    assert status["batches_total"] < 160


def test_idle_sessions_are_reaped() -> None:
    settings = ServeSettings(env="trivial", max_sessions=2, backend="thread", num_workers=1,
                             session_timeout=0.5)
    with TurnpoolServer(settings) as srv, _raw(srv.url) as ws:
        assert _ask(ws, {"type": "reset", "data": {"seed": 1}})["type"] == "observation"
        # the reaper closes the idle session: its error frame arrives unasked
        note = json.loads(ws.recv(timeout=30))
        assert note["type"] == "error" and "idle" in note["data"]["message"]
        status = _status(srv.url)
        assert status["active_sessions"] == 0 and status["reaped_sessions"] == 1


def test_a_token_guards_the_server() -> None:
    settings = ServeSettings(env="trivial", max_sessions=2, backend="thread", num_workers=1)
    with TurnpoolServer(settings, token="s3cret") as srv:
        # the health probe is open (load balancers, `openenv validate`); nothing else is
        assert httpx.get(srv.url + "/health", timeout=30).status_code == 200
        assert httpx.get(srv.url + "/state", timeout=30).status_code == 401
        assert httpx.get(srv.url + "/state", timeout=30,
                         headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert _status(srv.url, params={"token": "s3cret"})["capacity"] == 2
        with pytest.raises(Exception):  # noqa: B017 - the handshake is refused
            client(srv.url).reset()
        with client(srv.url, headers={"Authorization": "Bearer s3cret"}) as env:
            assert env.reset(seed=1).observation["text"]


def test_the_cli_refuses_to_listen_beyond_loopback_without_a_token() -> None:
    runner = CliRunner()
    res = runner.invoke(main, ["serve", "--host", "0.0.0.0"])
    assert res.exit_code == 2 and "--allow-remote" in res.output
    res = runner.invoke(main, ["serve", "--host", "0.0.0.0", "--allow-remote"],
                        env={"TURNPOOL_SERVE_TOKEN": ""})
    assert res.exit_code == 2 and "needs a token" in res.output
    with pytest.raises(PermissionError):
        TurnpoolServer(ServeSettings(env="trivial", backend="sequential"), host="0.0.0.0")


def test_the_cli_serves_and_leaves_no_worker_behind(tmp_path: Any) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text("env: sokoban\nmax_sessions: 4\nnum_workers: 2\n", encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-m", "turnpool.cli", "serve", "--config", str(config),
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the server prints its URL (or dies)
        assert "turnpool serve: sokoban x 4 sessions on process" in line, line
        url = line.split(" at ", 1)[1].split()[0]
        with client(url) as env:
            want, _ = turnpool.make("sokoban").reset(seed=8)
            assert env.reset(seed=8).observation["text"] == want
        workers = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        assert len(workers) >= 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert wait_gone(workers, within=30) == []


def test_a_pool_that_does_not_answer_is_bounded_by_call_timeout() -> None:
    # no step deadline in the pool: only the server's own call_timeout bounds the wait
    settings = ServeSettings(env="sleep", env_kwargs={"sleep_ms": 4000.0}, max_sessions=2,
                             backend="thread", num_workers=2, step_timeout=None,
                             call_timeout=0.5)
    with TurnpoolServer(settings) as srv:
        with _raw(srv.url) as ws:
            assert _ask(ws, {"type": "reset", "data": {"seed": 1}})["type"] == "observation"
            t0 = time.monotonic()
            reply = _ask(ws, {"type": "step", "data": {"action": "a"}})
            # a timeout reply can only come from call_timeout (the pool has no deadline, the
            # env answers after 4 s with an observation); the bound only says it came at all
            assert time.monotonic() - t0 < 30
            assert reply["type"] == "error" and reply["data"]["failure"] == "timeout"
        # the slot whose env may still be running is not leased again
        with _raw(srv.url) as one, _raw(srv.url) as two:
            assert _ask(one, {"type": "state"})["type"] == "state"
            refusal = json.loads(two.recv(timeout=30))  # sent unasked, then the server closes
            assert refusal["data"]["code"] == "CAPACITY_REACHED"
