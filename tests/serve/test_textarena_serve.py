"""A TextArena game served: ``openenv validate`` passes against ``turnpool serve --env
textarena:<id>``, and one WebSocket session plays a two-player game seat by seat (each
reply names the seat to move; the last pays every seat) exactly as TextArena's own loop."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import textarena as ta
from websockets.sync.client import connect

from tests.serve.conftest import openenv_validate
from turnpool.envs.hubs.textarena import listed_moves, observation_text
from turnpool.serve import ServeSettings, TurnpoolServer

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def server() -> Iterator[TurnpoolServer]:
    settings = ServeSettings(env="textarena:TicTacToe-v0", max_sessions=2,
                             backend="sequential")
    with TurnpoolServer(settings) as srv:
        yield srv


def test_openenv_validate_passes(server: TurnpoolServer) -> None:
    openenv_validate(server.url)


def _ask(ws: Any, kind: str, data: dict[str, Any]) -> dict[str, Any]:
    ws.send(json.dumps({"type": kind, "data": data}))
    reply = json.loads(ws.recv(timeout=60))
    assert reply["type"] == "observation", reply
    return dict(reply["data"])


def test_one_session_plays_both_seats_as_textarena_does(server: TurnpoolServer) -> None:
    seed = 8
    env = ta.make("TicTacToe-v0")
    env.reset(num_players=2, seed=seed)
    with connect(server.url.replace("http://", "ws://") + "/ws") as ws:
        reply = _ask(ws, "reset", {"seed": seed})
        seat = reply["observation"]["info"]["seat"]
        while True:
            pid, observation = env.get_observation()
            text = observation_text(observation)
            assert (seat, reply["observation"]["text"]) == (pid, text)
            move = listed_moves(text)[0]
            done, _ = env.step(action=move)
            reply = _ask(ws, "step", {"action": move})
            info = reply["observation"]["info"]
            assert reply["done"] == done
            if done:
                break
            seat = info["seat"]
    rewards, _ = env.close()
    assert info["seat_rewards"] == [float(rewards[0]), float(rewards[1])]
    assert info["acting_seat"] in (0, 1)
