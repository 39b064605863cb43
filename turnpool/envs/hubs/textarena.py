"""TextArena's games as turnpool envs: ``turnpool.make("textarena:TicTacToe-v0")``.

TextArena (``pip install 'turnpool[textarena]'``) runs a game as ``env.reset(num_players,
seed)``, then ``player_id, observation = env.get_observation()`` and ``done, info =
env.step(action)`` until done, and ``rewards, game_info = env.close()``. `TextArenaEnv` plays
that loop one move per ``step``, so the pool, the collector, fork, replay and serving treat a
game like any other env:

* the observation is what TextArena gives the player to move (its own wrappers' text; the
  ``-raw`` ids' message lists are joined one message per line);
* ``info["seat"]`` names that player and ``info["num_seats"]`` the players; the reward of a
  step is the acting player's, and when the game ends ``info["seat_rewards"]`` holds every
  player's (TextArena pays only at the end) with ``info["game_info"]`` its reasons;
* ``success`` is "the acting player won" (reward 1, TextArena's win; a single-player game:
  solved), and ``info["seat_success"]`` says it for every player at the end;
* a move TextArena refuses (``invalid move``) is ``action_is_valid=False``; TextArena decides
  whether the player moves again or loses.

Determinism: TextArena seeds and draws from the process-global ``random`` (and a few games
from ``numpy.random``). Each env keeps its own copy of both states and swaps them in only
while TextArena runs (`GlobalRngJail`), so two games interleaved in one process, or a game
and its caller, never see each other's draws; the thread backend still refuses the class
(``uses_global_rng``), since a swap is not atomic across threads.

Several players: `turnpool.multiplayer` plays every seat (self-play or a policy per seat)
and cuts per-seat trajectories; `turnpool.multiplayer.SeatAEC` is a PettingZoo AEC env.
"""

from __future__ import annotations

import contextlib
import functools
import io
import random
import re
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np

from turnpool.envs.base import TextEnv
from turnpool.extras import require

#: Player counts tried, in order, when an id does not say how many play.
_SEAT_COUNTS = (2, 1, 3, 4, 5, 6)
#: a bracketed move as TextArena lists them ("[4]", "[e2e4]"), not a speaker tag
_MOVE = re.compile(r"\[[^\[\]\n]{1,24}\]")
_SPEAKER = re.compile(r"\[(GAME|Player \d+)\]")


class GlobalRngJail:
    """A private copy of the process-global ``random`` and ``numpy.random`` states, swapped in
    around calls into a library that seeds and draws from them.

    Example:
        >>> import random
        >>> jail = GlobalRngJail(7)
        >>> before = random.getstate()
        >>> with jail:
        ...     random.seed(1); x = random.random()
        >>> random.getstate() == before
        True
    """

    def __init__(self, seed: int) -> None:
        self.py_state = random.Random(seed).getstate()
        self.np_state: Any = np.random.RandomState(seed % 2**32).get_state()
        self._saved: tuple[Any, Any] | None = None

    def __enter__(self) -> GlobalRngJail:
        self._saved = (random.getstate(), np.random.get_state())
        random.setstate(self.py_state)
        np.random.set_state(self.np_state)
        return self

    def __exit__(self, *exc: object) -> None:
        self.py_state, self.np_state = random.getstate(), np.random.get_state()
        assert self._saved is not None
        random.setstate(self._saved[0])
        np.random.set_state(self._saved[1])
        self._saved = None


def _textarena() -> Any:
    return require("textarena", feature="TextArena envs", extra="textarena")


def observation_text(observation: Any) -> str:
    """TextArena's observation as text: wrapped ids give a string; ``-raw`` ids a list of
    ``(from_id, message, kind)`` messages, joined one per line."""
    if isinstance(observation, str):
        return observation
    lines = []
    for message in observation or ():
        sender, text = message[0], message[1]
        who = "GAME" if sender == -1 else f"Player {sender}"
        lines.append(f"[{who}] {text}")
    return "\n".join(lines)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """TextArena prints (word lists, renders); a worker's stdout is not the place."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


@functools.cache
def seats_of(env_id: str) -> int:
    """How many players ``env_id`` is played with by default: the first of 2, 1, 3, 4, 5, 6
    its ``reset`` accepts (TextArena asserts the count it supports)."""
    ta = _textarena()
    last: Exception | None = None
    for n in _SEAT_COUNTS:
        with GlobalRngJail(0), _quiet():
            try:
                ta.make(env_id).reset(num_players=n, seed=0)
                return n
            except Exception as exc:  # noqa: BLE001 - TextArena asserts; try the next count
                last = exc
    raise ValueError(f"textarena:{env_id} does not start with 1-6 players ({last})")


def offline_ids() -> list[str]:
    """Every TextArena id (the registry), for listing; whether one runs offline is found by
    starting it (`seats_of`)."""
    from textarena.envs.registration import ENV_REGISTRY

    _textarena()
    return sorted(ENV_REGISTRY)


def listed_moves(obs: str, _config: Any = None) -> list[str]:
    """The moves the game lists last (``Available Moves: '[0]', '[1]'``...), in order; the
    ``oracle`` of `TextArenaEnv`: the oracle policy plays the first, a scripted opponent."""
    tail = obs[-600:]
    for marker in ("Available Moves:", "Valid moves:", "valid moves:", "Available actions:"):
        if marker in tail:
            tail = tail.rsplit(marker, 1)[1]
            break
    return [m for m in _MOVE.findall(tail) if not _SPEAKER.fullmatch(m)][:1]


class TextArenaEnv(TextEnv):
    """One TextArena game, one move per ``step`` (see the module doc).

    Example:
        >>> env = TextArenaEnv("TicTacToe-v0")
        >>> obs, info = env.reset(seed=3)
        >>> info["seat"], info["num_seats"], "Tic Tac Toe" in obs
        (0, 2, True)
        >>> obs, reward, done, _, info = env.step("[4]")
        >>> info["seat"], done
        (1, False)
    """

    action_kind: ClassVar[str | None] = "free_text"
    uses_global_rng: ClassVar[bool] = True
    #: TextArena's objects are not snapshots: a fork replays the seed and moves.
    snapshot_by_state: ClassVar[bool] = False
    extra_kwargs: ClassVar[frozenset[str] | None] = None
    oracle = staticmethod(listed_moves)

    def __init__(self, env_id: str, num_players: int | None = None, **config: Any) -> None:
        super().__init__(env_id=env_id, num_players=num_players, **config)
        self.env_id = env_id
        self.num_players = int(num_players) if num_players else seats_of(env_id)
        self._kwargs = {k: v for k, v in config.items() if k != "render_mode"}
        self._game: Any = None
        self._jail = GlobalRngJail(0)
        self._obs = ""
        self._seat = 0
        self._done = False

    def _reset(self, seed: int, options: dict[str, Any]) -> str:
        ta = _textarena()
        self._jail = GlobalRngJail(seed)
        with self._jail, _quiet():
            self._game = ta.make(self.env_id, **self._kwargs)
            self._game.reset(num_players=self.num_players, seed=seed)
            seat, observation = self._game.get_observation()
        self._seat, self._obs, self._done = int(seat), observation_text(observation), False
        return self._obs

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._done or self._game is None:
            return self._obs, 0.0, True, False, self._seat_info(action_is_valid=False)
        seat = self._seat
        with self._jail, _quiet():
            done, step_info = self._game.step(action=str(action))
            if done:
                rewards, game_info = self._game.close()
            else:
                next_seat, observation = self._game.get_observation()
        info: dict[str, Any] = {"step_info": _plain(step_info)}
        if done:
            self._done = True
            seat_rewards = [float(rewards.get(s, 0.0)) for s in range(self.num_players)]
            reason = str(game_info.get(seat, {}).get("reason", "game over"))
            self._obs = f"[GAME] {reason}"
            info.update(seat_rewards=seat_rewards, game_info=_plain(game_info),
                        seat_success=[r >= 1.0 for r in seat_rewards])
            reward = seat_rewards[seat]
            info.update(self._seat_info(action_is_valid=not game_info.get(seat, {}).get(
                "invalid_move", False), acting=seat))
            info["success"] = reward >= 1.0
            return self._obs, reward, True, False, info
        self._seat, self._obs = int(next_seat), observation_text(observation)
        # TextArena counts a player's refused moves until one is accepted
        invalid = int(getattr(self._game.state, "error_count", 0) or 0) > 0
        info.update(self._seat_info(action_is_valid=not invalid, acting=seat))
        return self._obs, 0.0, False, False, info

    def _seat_info(self, *, action_is_valid: bool, acting: int | None = None
                   ) -> dict[str, Any]:
        return {"seat": self._seat, "num_seats": self.num_players,
                "acting_seat": self._seat if acting is None else acting,
                "action_is_valid": action_is_valid, "action_is_effective": action_is_valid}

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[str, dict[str, Any]]:
        obs, info = super().reset(seed=seed, options=options)
        info.update(seat=self._seat, num_seats=self.num_players)
        return obs, info

    def _render_text(self) -> str:
        return self._obs

    def close(self) -> None:
        self._game = None


def _plain(value: Any) -> Any:
    """TextArena's info as plain JSON-able data (keys as strings, tuples as lists)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)
