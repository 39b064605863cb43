"""Multi-player games through the collector: every seat played (self-play, or a policy of its
own per seat), one trajectory per seat with that seat's rewards, GRPO groups per seat, and
moves that replay exactly in TextArena's own loop."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import textarena as ta

from turnpool.envs.hubs.textarena import observation_text
from turnpool.policies import make_policy
from turnpool.policies.base import Message, PolicyStats, TurnContext
from turnpool.policies.random import format_reply
from turnpool.pool import EnvPool
from turnpool.rollout.collector import TrajectoryCollector
from turnpool.rollout.seats import game_moves
from turnpool.rollout.settings import CollectorSettings

_LISTED = re.compile(r"\[\d+\]")


class ListedMoves:
    """A scripted player: a random one of the moves the board lists, seeded per env and turn."""

    kind = "listed"

    def __init__(self, seed: int) -> None:
        self.seed, self.stats = seed, PolicyStats()

    def generate(self, batch: list[list[Message]], contexts: list[TurnContext] | None = None
                 ) -> list[str]:
        assert contexts is not None
        out = []
        for ctx in contexts:
            rng = np.random.default_rng([self.seed, ctx.seed, ctx.env_id, ctx.turn])
            moves = _LISTED.findall(ctx.obs.rsplit("Available Moves:", 1)[-1]) or ["[0]"]
            out.append(format_reply([moves[int(rng.integers(len(moves)))]], ctx, "a move"))
        return out

    def close(self) -> None:
        pass


def collect(policy: Any, seat_policies: dict[int, Any] | None = None,
            backend: str = "sequential") -> Any:
    pool = EnvPool("textarena:TicTacToe-v0", env_num=3, group_n=2, seed=0, backend=backend,
                   num_workers=2)
    with TrajectoryCollector(pool, policy, settings=CollectorSettings(max_turn=9),
                             owns_pool=True, seat_policies=seat_policies) as col:
        return col.collect()


def replay_in_textarena(trajs: list[Any]) -> None:
    """Play a game's moves, taken from its seats' trajectories, in TextArena's own loop:
    the same player is asked to move, it sees what the trajectory says it saw, and the game
    pays what the trajectories were paid."""
    seed = trajs[0].seed
    env = ta.make("TicTacToe-v0")
    env.reset(num_players=2, seed=seed)
    moves = game_moves([t.turns for t in sorted(trajs, key=lambda t: t.seat)])
    done = False
    for seat, turn in moves:
        pid, observation = env.get_observation()
        assert (pid, observation_text(observation)) == (seat, turn.state)
        done, _ = env.step(action=turn.executed[0])
    assert done
    rewards, _ = env.close()
    assert [sum(t.rewards) for t in sorted(trajs, key=lambda t: t.seat)] == [
        float(rewards[0]), float(rewards[1])]


def test_self_play_gives_a_trajectory_per_seat_that_replays_in_textarena() -> None:
    batch = collect(ListedMoves(1))
    trajs = batch.trajectories
    assert len(trajs) == 12  # 6 games, 2 seats each
    assert {t.seat for t in trajs} == {0, 1}
    by_game: dict[int, list[Any]] = {}
    for t in trajs:
        by_game.setdefault(t.env_id, []).append(t)
        assert t.end_reason == "terminated" and t.group_uid.endswith(f"/seat{t.seat}")
        assert all(turn.info["seat"] == t.seat for turn in t.turns)
    for game in by_game.values():
        replay_in_textarena(game)
        rewards = sorted(sum(t.rewards) for t in game)
        assert rewards in ([-1.0, 1.0], [0.0, 0.0])
        assert [t.success for t in sorted(game, key=lambda t: t.seat)] == [
            sum(t.rewards) >= 1.0 for t in sorted(game, key=lambda t: t.seat)]


def test_grpo_groups_form_per_seat() -> None:
    trajs = collect(ListedMoves(2)).trajectories
    groups: dict[str, set[int | None]] = {}
    for t in trajs:
        groups.setdefault(t.group_uid, set()).add(t.seat)
    assert len(groups) == 6 and all(len(seats) == 1 for seats in groups.values())
    sizes = {uid: sum(t.group_uid == uid for t in trajs) for uid in groups}
    assert set(sizes.values()) == {2}


def test_a_seat_played_by_a_policy_of_its_own() -> None:
    """Seat 1 is the oracle (TextArena's first listed move, a scripted opponent)."""
    batch = collect(ListedMoves(3), {1: make_policy({"name": "oracle"})})
    for t in batch.trajectories:
        if t.seat != 1:
            continue
        for turn in t.turns:
            listed = _LISTED.findall(turn.state.rsplit("Available Moves:", 1)[-1])
            assert turn.executed == listed[:1]
    games: dict[int, list[Any]] = {}
    for t in batch.trajectories:
        games.setdefault(t.env_id, []).append(t)
    for game in games.values():
        replay_in_textarena(game)


def test_self_play_is_the_same_on_the_process_backend() -> None:
    one = [t.to_dict() for t in collect(ListedMoves(4)).trajectories]
    two = [t.to_dict() for t in collect(ListedMoves(4), backend="process").trajectories]
    assert one == two
