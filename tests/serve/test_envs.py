"""Every built-in env through ``turnpool serve`` with OpenEnv's own client classes, over
WebSocket and over HTTP: the same seed and actions give the same observations, rewards and
done flags as `turnpool.make` in this process."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from openenv.core.env_server.types import ResetResponse, StepResponse

import turnpool
from tests.serve.conftest import client
from turnpool.envs.registry import oracle_for, resolve
from turnpool.serve import ServeSettings, TurnpoolServer

pytestmark = pytest.mark.timeout(240)

BUILTIN = ["sokoban", "frozen_lake", "bandit", "countdown", "metamathqa", "webshop"]
SEEDS = [3, 1234]


def _plan(name: str, obs: str, env: Any) -> list[Any]:
    """Actions to replay: the env's oracle plan (episodes that end), else its action names."""
    _, defaults = resolve(name)
    try:
        plan = [str(a) for a in oracle_for(name)(obs, dict(defaults))]
    except Exception:
        plan = []
    if not plan and getattr(env, "action_lookup", None):
        plan = list(env.action_lookup.values())
    return (plan or ["noop"])[:6]


def _reference(name: str, seed: int) -> list[tuple[str, float | None, bool]]:
    """(obs, reward, done) of reset + each planned action, in this process."""
    env = turnpool.make(name)
    try:
        obs, _ = env.reset(seed=seed)
        out: list[tuple[str, float | None, bool]] = [(obs, None, False)]
        for action in _plan(name, obs, env):
            obs, reward, terminated, truncated, _ = env.step(action)
            out.append((obs, float(reward), terminated or truncated))
            if terminated or truncated:
                break
        return out
    finally:
        env.close()


def _actions(name: str, seed: int) -> list[Any]:
    env = turnpool.make(name)
    try:
        obs, _ = env.reset(seed=seed)
        return _plan(name, obs, env)
    finally:
        env.close()


@pytest.mark.parametrize("name", BUILTIN)
def test_same_seed_same_episode_over_ws_and_http(name: str) -> None:
    settings = ServeSettings(env=name, max_sessions=3, backend="process", num_workers=1,
                             step_timeout=60.0)
    with TurnpoolServer(settings) as server:
        for seed in SEEDS:
            want = _reference(name, seed)
            actions = _actions(name, seed)[: len(want) - 1]
            # WebSocket, OpenEnv's GenericEnvClient
            with client(server.url) as env:
                first = env.reset(seed=seed, episode_id=f"ep-{seed}")
                got = [(first.observation["text"], first.reward, first.done)]
                for action in actions:
                    r = env.step({"action": action})
                    got.append((r.observation["text"], r.reward, r.done))
                state = env.state()
            assert got == want
            assert state["episode_id"] == f"ep-{seed}"
            assert state["seed"] == seed and state["step_count"] == len(actions)
            # HTTP: OpenEnv's response models validate the replies
            with httpx.Client(base_url=server.url, timeout=60.0) as http:
                reply = http.post("/reset", json={"seed": seed, "stateful": True})
                assert reply.status_code == 200, reply.text
                reset = ResetResponse.model_validate(reply.json())
                sid = reset.metadata["session_id"] if reset.metadata else None
                got_http = [(reset.observation["text"], reset.reward, reset.done)]
                for action in actions:
                    reply = http.post("/step", json={"action": {"action": action},
                                                     "session_id": sid})
                    assert reply.status_code == 200, reply.text
                    step = StepResponse.model_validate(reply.json())
                    got_http.append((step.observation["text"], step.reward, step.done))
                assert http.post("/close", json={"session_id": sid}).status_code == 200
            assert got_http == want
