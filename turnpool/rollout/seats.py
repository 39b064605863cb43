"""Multi-player games in the collector: every seat played, one trajectory per seat.

A multi-player env (TextArena's two-player games through `turnpool.envs.hubs.textarena`) is
one env of the pool whose observation is the view of the player to move: ``info["seat"]``
names that player, ``info["num_seats"]`` the players, and when the game ends
``info["seat_rewards"]`` pays each one (``info["seat_success"]``: who won; absent, a
positive reward wins). `play_seats` drives such a batch in lock-step:

* each game has one `EpisodeState` per seat; a turn asks, for every running game, the policy
  of the seat to move (``seat_policies[seat]``, else the collector's own policy: self-play),
  with that seat's own history only, and steps every game in one pool call;
* the step's reward is the mover's; when the game ends every other seat's final reward is
  added to its last turn, ``success`` is the seat's entry of ``seat_success``, and every
  seat's episode ends with the game;
* each turn's ``info["seat"]`` is its mover (the env's next mover is ``info["next_seat"]``)
  and ``info["move"]`` the game's move number, so a game's moves come back in
  order from its seats' trajectories (`game_moves`);
* ``max_turn`` bounds each seat's turns; a failed game fails all its seats (no retries, as in
  tree rollouts).

The collector cuts per-seat trajectories whose ``group_uid`` ends in ``/seat<k>``, so GRPO
groups form per player.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from turnpool.policies.base import Policy
from turnpool.pool import EnvPool, TurnResult
from turnpool.rollout.episode import EpisodeState, TurnPlan, TurnRunner, step_plans
from turnpool.rollout.settings import CollectorSettings, TurnSettings
from turnpool.rollout.trajectory import Turn


def num_seats(infos: Sequence[Mapping[str, Any]]) -> int:
    """The players of a batch's games after reset (1: not a multi-player batch)."""
    return max((int(i.get("num_seats", 1) or 1) for i in infos), default=1)


@dataclass
class Game:
    """One env's game: an episode per seat, the seat to move, the moves played so far."""

    seats: list[EpisodeState]
    acting: int
    moves: int = 0
    done: bool = False
    seat_rewards: list[float] = field(default_factory=list)

    @property
    def mover(self) -> EpisodeState:
        return self.seats[self.acting]


def start_games(eps: Sequence[EpisodeState], infos: Sequence[Mapping[str, Any]]) -> list[Game]:
    """Seat episodes for each freshly reset episode: seat ``k`` is a copy of the env's
    episode with ``seat=k``; only the first mover has seen an observation yet."""
    games = []
    for ep, info in zip(eps, infos):
        n, first = int(info.get("num_seats", 1) or 1), int(info.get("seat", 0) or 0)
        seats = [dataclasses.replace(ep, turns=[], seat=k,
                                     state=ep.state if k == first else "",
                                     anchor_obs=ep.anchor_obs if k == first else "")
                 for k in range(n)]
        game = Game(seats, first, done=ep.done)
        if ep.done:  # the reset failed: every seat fails with it
            for seat in seats:
                seat.fail(str(ep.error), str(ep.failure))
        games.append(game)
    return games


def play_games(pool: EnvPool, eps: Sequence[EpisodeState], infos: Sequence[Mapping[str, Any]],
               runners: Callable[[int], TurnRunner], settings: CollectorSettings, *,
               recording: bool, on_turn: Callable[[int, int], None] | None = None
               ) -> tuple[list[EpisodeState], int]:
    """The collector's multi-player batch: seat episodes for freshly reset ``eps``, played
    to the end; returns every seat's episode and the pool steps taken. Lock-step only, not
    recorded, no retries."""
    if settings.tree.enabled or settings.collector_mode != "lockstep" or recording:
        raise ValueError("multi-player games run in the lockstep collector only, without "
                         "tree modes or --record")
    games = start_games(eps, infos)
    steps = play_seats(pool, games, runners, settings.turn, settings.max_turn, on_turn)
    return [ep for game in games for ep in game.seats], steps


def play_seats(pool: EnvPool, games: Sequence[Game], runners: Callable[[int], TurnRunner],
               settings: TurnSettings, max_turn: int,
               on_turn: Callable[[int, int], None] | None = None) -> int:
    """Play ``games`` to their end or until every seat has had ``max_turn`` turns; returns
    the number of pool steps taken. ``runners(seat)``: the turn runner of that seat's
    policy."""
    steps, turn = 0, 0
    while True:
        live = [g for g in games if not g.done and len(g.mover.turns) < max_turn]
        if not live:
            return steps
        plans = _plan(live, runners)
        results = step_plans(pool, [g.mover for g in live], plans, settings)
        for game, plan, result in zip(live, plans, results):
            steps += int(result is not None and result.n_executed > 0)
            _record(game, plan, result, runners(game.acting))
        if on_turn is not None:
            on_turn(turn, len(live))
        turn += 1


def _plan(live: Sequence[Game], runners: Callable[[int], TurnRunner]) -> list[TurnPlan]:
    """Each mover's reply from its seat's policy: one ``generate`` call per policy."""
    plans: list[TurnPlan | None] = [None] * len(live)
    by_runner: dict[int, tuple[TurnRunner, list[int]]] = {}
    for k, game in enumerate(live):
        runner = runners(game.acting)
        by_runner.setdefault(id(runner), (runner, []))[1].append(k)
    for runner, members in by_runner.values():
        eps = [live[k].mover for k in members]
        messages, contexts = runner.prompts(eps)
        for k, plan in zip(members, runner.plan(eps, runner.generate(messages, contexts))):
            plans[k] = plan
    return [p for p in plans if p is not None]


def _record(game: Game, plan: TurnPlan, result: TurnResult | None, runner: TurnRunner) -> None:
    """File the mover's turn, hand the next observation to the seat that moves next, and end
    every seat's episode with the game."""
    mover = game.mover
    runner.record(mover, plan, result)
    turn = mover.turns[-1]
    turn.info["move"] = game.moves
    if "seat" in turn.info:  # the env's seat is the next mover's; the turn is the mover's
        turn.info["next_seat"] = turn.info["seat"]
    turn.info["seat"] = game.acting
    game.moves += 1
    if mover.error is not None:
        for ep in game.seats:
            if ep is not mover:
                ep.fail(str(mover.error), str(mover.failure))
        game.done = True
        return
    if result is None:  # nothing ran (no valid action): the same seat moves again
        if mover.done:
            _end(game, mover, (), None)
        return
    if result.terminated or result.truncated:
        _end(game, mover, result.info.get("seat_rewards", ()),
             result.info.get("seat_success"))
        return
    if mover.done:  # the mover's action budget is spent: the game stops here for all
        _end(game, mover, (), None)
        return
    game.acting = int(result.info.get("seat", game.acting))
    nxt = game.mover
    nxt.state = str(result.obs)
    nxt.anchor_obs = str(result.info.get("anchor_obs", result.obs))


def _end(game: Game, mover: EpisodeState, seat_rewards: Sequence[Any],
         seat_success: Sequence[Any] | None) -> None:
    rewards = [float(r) for r in seat_rewards]
    game.done, game.seat_rewards = True, rewards
    for seat, ep in enumerate(game.seats):
        reward = rewards[seat] if seat < len(rewards) else 0.0
        if ep is not mover and ep.turns:
            ep.turns[-1].reward += reward
            ep.turns[-1].done = True
        won = seat_success[seat] if seat_success and seat < len(seat_success) else reward > 0
        ep.done, ep.success = True, bool(won)
        ep.terminated, ep.truncated = mover.terminated, mover.truncated
        ep.end_reason = mover.end_reason


def game_moves(seat_turns: Sequence[Sequence[Turn]]) -> list[tuple[int, Turn]]:
    """A game's moves in order, ``(seat, turn)``, from its seats' turns (each turn's
    ``info["move"]``)."""
    moves = [(seat, t) for seat, turns in enumerate(seat_turns) for t in turns]
    return sorted(moves, key=lambda m: int(m[1].info["move"]))


def seat_runners(default: TurnRunner, seat_policies: Mapping[int, Policy],
                 settings: TurnSettings) -> Callable[[int], TurnRunner]:
    """``seat -> TurnRunner``: the collector's own runner (self-play) unless the seat has a
    policy of its own; the sink (a recorder) is the collector's."""
    own = {int(k): TurnRunner(p, settings) for k, p in seat_policies.items()}
    return lambda seat: own.get(seat, default)
