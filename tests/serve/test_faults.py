"""Faults through ``turnpool serve``: a hanging env answers with an error within
``step_timeout``, an env that kills its worker (or raises) fails only its own session, and a
failed step is an OpenEnv error naming turnpool's failure class, never an observation with
reward 0. The envs are the ``faulty`` test env on two real worker processes."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from tests.serve.conftest import client, expected_failure
from turnpool.serve import ServeSettings, TurnpoolServer

pytestmark = pytest.mark.timeout(180)

STEP_TIMEOUT = 1.5


@pytest.fixture(scope="module")
def server() -> Iterator[TurnpoolServer]:
    # 4 slots on 2 workers: slots 0, 1 share worker 0, slots 2, 3 share worker 1
    settings = ServeSettings(env="faulty", env_kwargs={"episode_len": 1000}, max_sessions=4,
                             backend="process", num_workers=2, step_timeout=STEP_TIMEOUT)
    with TurnpoolServer(settings) as srv:
        yield srv


def _raw(url: str) -> Any:
    return connect(url.replace("http://", "ws://") + "/ws", open_timeout=30)


def _ask(ws: Any, message: dict[str, Any]) -> dict[str, Any]:
    ws.send(json.dumps(message))
    reply: dict[str, Any] = json.loads(ws.recv(timeout=60))
    return reply


@contextlib.contextmanager
def _mates(server: TurnpoolServer, bad_seed: int, good_seed: int
           ) -> Iterator[tuple[Any, Any, str]]:
    """Two reset sessions whose slots share a worker (so a fault in one hits the other's
    worker), and the good one's first observation. The server spreads sessions over its
    workers, so sessions are opened until one lands beside the first; those stay open
    meanwhile."""
    owner = {i: w for w, ids in enumerate(server.engine.pool.backend.slices) for i in ids}
    opened: list[Any] = []

    def newest_slot() -> int:
        status = httpx.get(server.url + "/api/status", timeout=30).json()
        return int(status["sessions"][-1]["slot"])

    try:
        bad = _raw(server.url)
        opened.append(bad)
        assert _ask(bad, {"type": "reset", "data": {"seed": bad_seed}})["type"] == "observation"
        bad_worker = owner[newest_slot()]
        while True:
            good = _raw(server.url)
            opened.append(good)
            first = _ask(good, {"type": "reset", "data": {"seed": good_seed}})
            if owner[newest_slot()] == bad_worker:
                break
        yield bad, good, first["data"]["observation"]["text"]
    finally:
        for ws in opened:
            ws.close()


def _clean_trace(url: str, seed: int, actions: list[str]) -> list[str]:
    """The observations of an episode played alone: what an innocent session must see."""
    with _raw(url) as ref:
        out = [_ask(ref, {"type": "reset", "data": {"seed": seed}})["data"]["observation"]["text"]]
        for action in actions:
            out.append(_ask(ref, {"type": "step", "data": {"action": action}})
                       ["data"]["observation"]["text"])
    return out


def _fault_isolated(server: TurnpoolServer, action: str, failure: str,
                    max_seconds: float) -> None:
    """Two sessions on one worker: the faulty one gets an error; the other's episode is
    exactly what it would have been; the faulty one recovers with a reset."""
    url = server.url
    with _mates(server, 5, 9) as (bad, good, first):
        trace = [first]
        for k in range(3):
            trace.append(_ask(good, {"type": "step", "data": {"action": f"a{k}"}})
                         ["data"]["observation"]["text"])
        t0 = time.monotonic()
        reply = _ask(bad, {"type": "step", "data": {"action": action}})
        elapsed = time.monotonic() - t0
        assert reply["type"] == "error", reply
        data = reply["data"]
        assert data["code"] == "EXECUTION_ERROR"
        assert data["failure"] == failure
        assert isinstance(data["retryable"], bool)
        assert "reward" not in data and data["error"]
        assert elapsed < max_seconds
        # the innocent session goes on as if nothing happened (reset + replay in the pool)
        for k in range(3, 6):
            trace.append(_ask(good, {"type": "step", "data": {"action": f"a{k}"}})
                         ["data"]["observation"]["text"])
        # the failed episode is over until the next reset, which works
        again = _ask(bad, {"type": "step", "data": {"action": "x"}})
        assert again["type"] == "error" and "reset" in again["data"]["message"]
        assert _ask(bad, {"type": "reset", "data": {"seed": 5}})["type"] == "observation"
        assert _ask(bad, {"type": "step", "data": {"action": "fine"}})["type"] == "observation"
    assert trace == _clean_trace(url, 9, [f"a{k}" for k in range(6)])


def test_a_hanging_env_errors_within_step_timeout(server: TurnpoolServer) -> None:
    _fault_isolated(server, "hang", expected_failure("timeout"), STEP_TIMEOUT + 10)


def test_a_session_on_a_hung_envs_worker_plays_on_meanwhile(server: TurnpoolServer) -> None:
    """No head-of-line blocking: while one session's env hangs, a session whose env shares
    its worker is answered (its first step comes back before the hang's timeout reply), and
    plays 20 exact steps."""
    url = server.url
    with _mates(server, 5, 19) as (bad, good, first):
        trace = [first]
        t0 = time.monotonic()
        bad.send(json.dumps({"type": "step", "data": {"action": "hang"}}))
        for k in range(20):
            trace.append(_ask(good, {"type": "step", "data": {"action": f"b{k}"}})
                         ["data"]["observation"]["text"])
            if k == 0:  # answered while the hung env's step is still pending
                with pytest.raises(TimeoutError):
                    bad.recv(timeout=0)
        reply = json.loads(bad.recv(timeout=60))
        bad_s = time.monotonic() - t0
        assert reply["type"] == "error" and reply["data"]["failure"] == "timeout"
        # the deadline fired (the hang lasts an hour), and not before it was due
        assert STEP_TIMEOUT - 0.5 < bad_s < STEP_TIMEOUT + 30
    assert trace == _clean_trace(url, 19, [f"b{k}" for k in range(20)])


def test_an_env_that_kills_its_worker_fails_only_its_session(server: TurnpoolServer) -> None:
    _fault_isolated(server, "exit", expected_failure("worker_lost"), 60)


def test_an_env_that_raises_fails_only_its_session(server: TurnpoolServer) -> None:
    _fault_isolated(server, "raise", "env_error", 30)


def test_openenv_client_raises_with_the_failure_class(server: TurnpoolServer) -> None:
    with client(server.url) as env:
        env.reset(seed=1)
        with pytest.raises(RuntimeError) as err:
            env.step({"action": "raise"})
        assert "EXECUTION_ERROR" in str(err.value) and "env_error" in str(err.value)
        assert env.reset(seed=1).observation["text"]


def test_failures_show_in_the_status(server: TurnpoolServer) -> None:
    status = httpx.get(server.url + "/api/status", timeout=30).json()
    assert sum(status["failures"].values()) >= 1
    assert status["recent_failures"][-1]["error"]


@pytest.mark.parametrize("backend", ["sequential", "thread", "auto"])
def test_a_sleeping_env_is_cut_on_in_process_backends(backend: str) -> None:
    """The server's pool runs on its own thread, where no timer signal reaches an env: an env
    blocked in ``time.sleep`` is still failed with ``timeout`` within step_timeout + 1 s, and
    the session sharing its worker plays on exactly (one worker holds every slot)."""
    settings = ServeSettings(env="faulty", env_kwargs={"episode_len": 1000}, max_sessions=4,
                             backend=backend, num_workers=1, step_timeout=STEP_TIMEOUT)
    with TurnpoolServer(settings) as srv:
        _fault_isolated(srv, "hang", expected_failure("timeout"), STEP_TIMEOUT + 1.0)
        health = httpx.get(srv.url + "/health", timeout=30).json()
        assert health["status"] == "healthy"
