"""TextArena's games as turnpool envs: ``turnpool.make("textarena:TicTacToe-v0")``.

TextArena (``pip install 'turnpool[textarena]'``) runs a game as ``env.reset(num_players,
seed)``, then ``player_id, observation = env.get_observation()`` and ``done, info =
env.step(action)`` until done, and ``rewards, game_info = env.close()``. `TextArenaEnv` plays
that loop one move per ``step`` (a `turnpool.envs.hubs.base.HubEnv`), so the pool, the
collector, fork, replay and serving treat a game like any other env:

* the observation is what TextArena gives the player to move (its own wrappers' text; the
  ``-raw`` ids' message lists are joined one message per line);
* ``info["seat"]`` names that player and ``info["num_seats"]`` the players; the reward of a
  step is the acting player's (``info["acting_seat"]``), and when the game ends
  ``info["seat_rewards"]`` holds every player's (TextArena pays only at the end) with
  ``info["game_info"]`` its reasons;
* ``success`` is "the acting player won" (reward 1, TextArena's win; a single-player game:
  solved), and ``info["seat_success"]`` says it for every player at the end;
* a move TextArena refuses (``invalid move``) is ``action_is_valid=False``; TextArena decides
  whether the player moves again or loses;
* ``num_players`` picks the player count; by default the first of 2, 1, 3, 4, 5, 6 the game
  accepts.

Determinism: TextArena seeds and draws from the process-global ``random`` (and a few games
from ``numpy.random``): every call runs in the env's own `turnpool.envs.hub_table.GlobalRngScope`
(``uses_global_rng``), so interleaved games in one process, and the caller, never see each
other's draws.

Several players: `turnpool.rollout.seats` plays every seat (self-play or a policy per seat)
and cuts per-seat trajectories; `turnpool.envs.aec.SeatAEC` is a PettingZoo AEC env.

Example:
    >>> env = TextArenaEnv("TicTacToe-v0")
    >>> obs, info = env.reset(seed=3)
    >>> info["seat"], info["num_seats"], "Tic Tac Toe" in obs
    (0, 2, True)
    >>> obs, reward, done, _, info = env.step("[4]")
    >>> info["seat"], done
    (1, False)
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
from collections.abc import Iterator
from typing import Any

from turnpool.envs.hub_table import GlobalRngScope, hub
from turnpool.envs.hubs.base import HubEnv, plain

#: Player counts tried, in order, when an id does not say how many play.
_SEAT_COUNTS = (2, 1, 3, 4, 5, 6)
#: a bracketed move as TextArena lists them ("[4]", "[e2e4]"), not a speaker tag
_MOVE = re.compile(r"\[[^\[\]\n]{1,24}\]")
_SPEAKER = re.compile(r"\[(GAME|Player \d+)\]")


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
    ta = hub("textarena").require()
    last: Exception | None = None
    for n in _SEAT_COUNTS:
        with GlobalRngScope(0), _quiet():
            try:
                ta.make(env_id).reset(num_players=n, seed=0)
                return n
            except Exception as exc:  # noqa: BLE001 - TextArena asserts; try the next count
                last = exc
    raise ValueError(f"textarena:{env_id} does not start with 1-6 players ({last})")


def listed_moves(obs: str, _config: Any = None) -> list[str]:
    """The first move the game lists last (``Available Moves: '[0]', '[1]'``...): the
    ``oracle`` of `TextArenaEnv`, so the oracle policy is a simple scripted opponent."""
    tail = obs[-600:]
    for marker in ("Available Moves:", "Valid moves:", "valid moves:", "Available actions:"):
        if marker in tail:
            tail = tail.rsplit(marker, 1)[1]
            break
    return [m for m in _MOVE.findall(tail) if not _SPEAKER.fullmatch(m)][:1]


class TextArenaEnv(HubEnv):
    """One TextArena game, one move per ``step`` (see the module doc)."""

    hub_prefix = "textarena"
    uses_global_rng = True
    oracle = staticmethod(listed_moves)

    def __init__(self, env_id: str, num_players: int | None = None, **kwargs: Any) -> None:
        self.num_players = int(num_players) if num_players else seats_of(env_id)
        self._seat = 0
        self._refused = False
        super().__init__(env_id, **kwargs)

    def _build(self, env_id: str, kwargs: dict[str, Any]) -> Any:
        self._kwargs = dict(kwargs)
        return None  # a fresh game per reset

    @classmethod
    def env_ids(cls) -> list[str]:
        from textarena.envs.registration import ENV_REGISTRY

        return sorted(ENV_REGISTRY)

    def _library_reset(self, seed: int, options: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        with _quiet():
            self.inner = self.library.make(self.env_id, **self._kwargs)
            self.inner.reset(num_players=self.num_players, seed=seed)
            seat, observation = self.inner.get_observation()
        self._seat = int(seat)
        return observation_text(observation), {"seat": self._seat,
                                               "num_seats": self.num_players}

    def _library_step(self, action: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        acting = self._seat
        with _quiet():
            done, step_info = self.inner.step(action=action)
            if done:
                rewards, game_info = self.inner.close()
            else:
                seat, observation = self.inner.get_observation()
        info: dict[str, Any] = {"step_info": plain(step_info), "acting_seat": acting,
                                "num_seats": self.num_players}
        if not done:
            # TextArena's states count a player's refused moves until one is accepted
            self._refused = int(self.inner.state.error_count or 0) > 0
            self._seat = int(seat)
            info["seat"] = self._seat
            return observation_text(observation), 0.0, False, False, info
        paid = [float(rewards.get(s, 0.0)) for s in range(self.num_players)]
        mine = game_info.get(acting, {})
        self._refused = bool(mine.get("invalid_move", False))
        info.update(seat=acting, seat_rewards=paid, game_info=plain(game_info),
                    seat_success=[r >= 1.0 for r in paid], success=paid[acting] >= 1.0)
        return f"[GAME] {mine.get('reason', 'game over')}", paid[acting], True, False, info

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        done_before = self._done
        self._refused = False
        obs, reward, terminated, truncated, info = super()._step(action)
        if not done_before and action is not None and self._refused:
            info["action_is_valid"] = info["action_is_effective"] = False
        return obs, reward, terminated, truncated, info

    def _library_close(self) -> None:
        self.inner = None  # a finished game was closed by its last step
