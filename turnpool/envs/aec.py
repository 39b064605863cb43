"""A multi-player turnpool env as a PettingZoo AEC env (``pip install pettingzoo``).

`SeatAEC` wraps any env that reports its players the way `turnpool.rollout.seats` reads them
(``info["seat"]``, ``info["num_seats"]``, ``info["seat_rewards"]`` at the end; TextArena's
games through `turnpool.envs.hubs.textarena`). Agents are ``player_0 ... player_{n-1}``;
``agent_selection`` is the player to move; ``observe(agent)`` is the last text that agent was
shown; when the game ends every agent is terminated (or truncated) with its reward, and each
then takes the usual ``step(None)`` before it leaves ``agents``. Observation and action
spaces are text (`turnpool.envs.base.TextSpace`).

Example:
    >>> from turnpool.envs.hubs.textarena import TextArenaEnv
    >>> aec = SeatAEC(TextArenaEnv("TicTacToe-v0"))
    >>> aec.reset(seed=1)
    >>> aec.agent_selection, aec.num_agents
    ('player_0', 2)
    >>> aec.step("[4]"); aec.agent_selection
    'player_1'
"""

from __future__ import annotations

from typing import Any

from turnpool.envs.base import MAX_ACTION_CHARS, OBSERVATION_SPACE, TextEnv, TextSpace
from turnpool.extras import require

_pz = require("pettingzoo", feature="PettingZoo's AEC API", extra="textarena")

#: one space object for every agent (PettingZoo checks identity)
ACTION_SPACE = TextSpace(MAX_ACTION_CHARS)


def agent_name(seat: int) -> str:
    return f"player_{seat}"


class SeatAEC(_pz.AECEnv):  # type: ignore[misc,name-defined]
    """A multi-player `TextEnv` played seat by seat, as PettingZoo's AEC API (module doc)."""

    metadata = {"render_modes": ["human"], "name": "turnpool_seat_aec", "is_parallelizable": False}  # noqa: RUF012

    def __init__(self, env: TextEnv) -> None:
        super().__init__()
        self.env = env
        self.possible_agents: list[str] = []  # known once reset names the seats
        self.agents: list[str] = []
        self._shown: dict[str, str] = {}
        self._next_seed: int | None = None

    def observation_space(self, agent: str) -> Any:
        return OBSERVATION_SPACE

    def action_space(self, agent: str) -> Any:
        return ACTION_SPACE

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        obs, info = self.env.reset(seed=seed, options=options)
        n = int(info.get("num_seats", 1) or 1)
        self.possible_agents = [agent_name(k) for k in range(n)]
        self.agents = list(self.possible_agents)
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos: dict[str, dict[str, Any]] = {a: {} for a in self.agents}
        self._shown = {a: "" for a in self.agents}
        self.agent_selection = agent_name(int(info.get("seat", 0) or 0))
        self._shown[self.agent_selection] = obs

    def observe(self, agent: str) -> str:
        return self._shown.get(agent, "")

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        if self.terminations.get(agent) or self.truncations.get(agent):
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        self._clear_rewards()
        obs, _reward, terminated, truncated, info = self.env.step(
            "" if action is None else str(action))
        if terminated or truncated:
            paid = list(info.get("seat_rewards", ()))
            for k, a in enumerate(self.agents):
                self.rewards[a] = float(paid[k]) if k < len(paid) else 0.0
                self.terminations[a], self.truncations[a] = bool(terminated), bool(truncated)
                self.infos[a] = {"game_info": info.get("game_info")}
            self._shown = {a: obs for a in self.agents}
        else:
            self.agent_selection = agent_name(int(info.get("seat", 0) or 0))
            self._shown[self.agent_selection] = obs
        self._accumulate_rewards()

    def render(self) -> str:
        return self._shown.get(self.agent_selection, "")

    def close(self) -> None:
        self.env.close()
