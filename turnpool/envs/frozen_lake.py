"""FrozenLake: walk from the start to the goal across a lake with holes, on slippery ice.

RAGEN's semantics (gymnasium's FrozenLake underneath), written without gymnasium but
drawing the same numbers: the map from a generator seeded with the reset seed, the moves from
a second one seeded the same way, one uniform draw per reset and per step:

* the map is ``size`` x ``size``; each cell is frozen with probability ``p`` (else a hole;
  0.9, RAGEN v2's default, as is ``success_rate`` 0.8; RAGEN v1 and gymnasium: 0.8 and 1/3);
  start and goal are two distinct random cells, and maps without a start -> goal path are
  redrawn from the same generator, so one seed gives one map everywhere;
* actions 1 Left, 2 Down, 3 Right, 4 Up; on slippery ice the move goes in the intended
  direction with probability ``success_rate``, else either perpendicular one with half the
  rest (``success_rate`` 1/3: each with 1/3, as in gymnasium); moving into the edge
  leaves the player in place;
* reward 1 on reaching the goal, else 0; the episode ends in a hole or on the goal (the step
  budget lives in the manager, as in RAGEN);
* observation rows joined by ``"\\n"``: ``P`` player, ``_`` frozen (the start too), ``O`` hole,
  ``G`` goal, ``X`` player in a hole, ``√`` player on the goal; ``render("rgb_array")`` draws
  the same board as a ``(size*16, size*16, 3)`` uint8 image (tiles drawn in code).

:func:`optimal_policy` solves a map by value iteration; :func:`oracle` reads an observation
and returns the best next action (slippery) or the whole shortest path (not slippery).

Example:
    >>> env = FrozenLakeEnv(is_slippery=False)
    >>> obs, _ = env.reset(seed=1)
    >>> for name in oracle(obs, {"is_slippery": False}):
    ...     obs, reward, terminated, truncated, info = env.step(name)
    >>> reward, info["success"]
    (1.0, True)
"""

from __future__ import annotations

from collections import deque
from functools import lru_cache
from typing import Any

import numpy as np

from turnpool.envs.base import TextEnv
from turnpool.envs.coords import backtrack, cells, check_format, formatted

ACTIONS: dict[int, str] = {1: "Left", 2: "Down", 3: "Right", 4: "Up"}
_MOVES: dict[int, tuple[int, int]] = {1: (0, -1), 2: (1, 0), 3: (0, 1), 4: (-1, 0)}
# Counter-clockwise order, so the perpendicular moves of action a are its neighbours here.
_RING = (1, 2, 3, 4)

Cell = tuple[int, int]
Desc = tuple[str, ...]  # rows of "F" frozen, "H" hole, "S" start, "G" goal


# --------------------------------------------------------------------------- map generation
def has_path(desc: Desc) -> bool:
    """Whether the goal can be reached from the start without stepping into a hole."""
    size = len(desc)
    start = next((r, c) for r in range(size) for c in range(size) if desc[r][c] == "S")
    return _shortest_path(desc, start) is not None


def generate_map(rng: np.random.Generator, size: int = 4, p: float = 0.8) -> Desc:
    """A random map with a start -> goal path; redraws from ``rng`` until one has a path.

    The draws are RAGEN's (``generate_random_map``): a frozen/hole board by
    ``rng.choice(["F", "H"], p=[p, 1 - p])``, then start and goal as ``rng.integers(size,
    size=2)`` each; boards whose start is the goal or has no path are redrawn.
    """
    if size < 2:
        raise ValueError("size must be at least 2")
    if not 0.0 < p <= 1.0:
        raise ValueError("p (probability of a frozen cell) must be in (0, 1]")
    while True:
        board = rng.choice(["F", "H"], (size, size), p=[p, 1 - p])
        start = tuple(int(v) for v in rng.integers(size, size=2))
        goal = tuple(int(v) for v in rng.integers(size, size=2))
        if start == goal:
            continue
        grid = [[str(ch) for ch in row] for row in board]
        grid[start[0]][start[1]] = "S"
        grid[goal[0]][goal[1]] = "G"
        desc = tuple("".join(row) for row in grid)
        if has_path(desc):
            return desc


# --------------------------------------------------------------------------- dynamics
#: gymnasium's default chance of moving where intended on slippery ice (RAGEN v1's too).
SUCCESS_RATE = 1.0 / 3.0


@lru_cache(maxsize=64)
def slip_cdf(success_rate: float) -> tuple[float, ...]:
    """Cumulative probabilities of (left of intended, intended, right of intended) on
    slippery ice, summed as gymnasium sums them, so one uniform draw picks the same move."""
    fail = (1.0 - success_rate) / 2.0
    return tuple(float(c) for c in np.cumsum([fail, success_rate, fail]))


def _sample(cdf: tuple[float, ...], u: float) -> int:
    """gymnasium's ``categorical_sample``: the first index whose cumulative share exceeds u."""
    return next((i for i, c in enumerate(cdf) if c > u), 0)


def _moved(cell: Cell, action: int, size: int) -> Cell:
    dr, dc = _MOVES[action]
    return min(max(cell[0] + dr, 0), size - 1), min(max(cell[1] + dc, 0), size - 1)


def _outcomes(action: int, slippery: bool) -> tuple[int, ...]:
    """The equally likely actual moves for an intended ``action``."""
    if not slippery:
        return (action,)
    i = _RING.index(action)
    return (_RING[(i - 1) % 4], action, _RING[(i + 1) % 4])


def _shortest_path(desc: Desc, start: Cell) -> list[int] | None:
    """Actions of a shortest hole-free path from ``start`` to the goal (deterministic moves)."""
    size = len(desc)
    parent: dict[Cell, tuple[Cell, int] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if desc[cell[0]][cell[1]] == "G":
            return backtrack(parent, cell)
        for action in ACTIONS:
            nxt = _moved(cell, action, size)
            if nxt not in parent and desc[nxt[0]][nxt[1]] != "H":
                parent[nxt] = (cell, action)
                queue.append(nxt)
    return None


@lru_cache(maxsize=512)
def optimal_policy(
    desc: Desc, is_slippery: bool = True, gamma: float = 0.95, tol: float = 1e-10
) -> tuple[np.ndarray, np.ndarray]:
    """``(policy, values)`` for a map, by value iteration.

    ``policy[r, c]`` is the best action id at cell ``(r, c)`` (ties go to the lowest id) and
    ``values[r, c]`` the discounted probability of reaching the goal from there. Discounting
    (``gamma`` < 1) prefers short routes, which matters under a step budget.
    """
    size = len(desc)
    n = size * size
    flat = "".join(desc)
    terminal = np.array([ch in "HG" for ch in flat])
    # transition[a, s, s2]: probability; reward[a, s]: expected immediate reward.
    transition = np.zeros((4, n, n))
    reward = np.zeros((4, n))
    for s in range(n):
        if terminal[s]:
            continue
        for a in ACTIONS:
            moves = _outcomes(a, is_slippery)
            for m in moves:
                r2, c2 = _moved(divmod(s, size), m, size)
                s2 = r2 * size + c2
                transition[a - 1, s, s2] += 1.0 / len(moves)
                reward[a - 1, s] += (flat[s2] == "G") / len(moves)
    values = np.zeros(n)
    for _ in range(100_000):
        q = reward + gamma * transition @ np.where(terminal, 0.0, values)
        new_values = np.where(terminal, 0.0, q.max(axis=0))
        done = np.max(np.abs(new_values - values)) < tol
        values = new_values
        if done:
            break
    q = reward + gamma * transition @ values
    best = np.argmax(q >= q.max(axis=0) - 1e-9, axis=0) + 1
    policy = best.reshape(size, size)
    grid_values = values.reshape(size, size)
    for array in (policy, grid_values):
        array.setflags(write=False)  # cached and shared between callers
    return policy, grid_values


# --------------------------------------------------------------------------- tiles
#: Pixels per cell side in ``render("rgb_array")`` (Sokoban's size, so frames line up).
TILE = 16
_ICE, _HOLE, _GOAL, _PLAYER, _PLAYER_IN_HOLE, _PLAYER_ON_GOAL = range(6)


@lru_cache(maxsize=1)
def tiles() -> np.ndarray:
    """``(6, TILE, TILE, 3)`` uint8 images: ice, hole, goal, and the player on each."""
    y, x = np.mgrid[0:TILE, 0:TILE]
    centre = (TILE - 1) / 2
    disc = (x - centre) ** 2 + (y - centre) ** 2

    def filled(rgb: tuple[int, int, int]) -> np.ndarray:
        tile = np.empty((TILE, TILE, 3), dtype=np.uint8)
        tile[:] = rgb
        tile[(x == 0) | (y == 0)] = (150, 190, 214)  # grid lines between cells
        return tile

    ice = filled((204, 230, 244))
    hole = filled((204, 230, 244))
    hole[disc <= 6.2**2] = (24, 52, 96)
    goal = filled((204, 230, 244))
    goal[(np.abs(x - centre) <= 5.5) & (np.abs(y - centre) <= 5.5)] = (232, 184, 40)

    def with_player(under: np.ndarray) -> np.ndarray:
        tile = under.copy()
        tile[disc <= 4.2**2] = (208, 64, 48)
        tile[disc <= 1.6**2] = (250, 240, 236)
        return tile

    out = np.stack([ice, hole, goal, with_player(ice), with_player(hole), with_player(goal)])
    out.setflags(write=False)
    return out


# --------------------------------------------------------------------------- env
class FrozenLakeEnv(TextEnv):
    """Grid walk on (slippery) ice; see the module docstring for the rules."""

    action_kind = "discrete"
    #: what RAGEN's env reports in ``info`` (the RAGEN facade shows only these)
    ragen_info_keys = ("action_is_effective", "action_is_valid", "success")
    #: RAGEN's env returns whole-number rewards as ints (the reward text reads ``1``)
    ragen_int_rewards = True
    action_lookup = dict(ACTIONS)
    grid_vocab = {"P": "player", "_": "empty", "O": "hole", "G": "goal",
                  "X": "player in hole", "√": "player on goal"}
    instruction = (
        "You are solving the FrozenLake puzzle. Avoid the holes and reach the goal. The ice is "
        "slippery, so a move may carry you sideways instead of where you meant to go. Example "
        "answer format: <think>The goal is below me and the hole is to my left, so I go down."
        "</think><answer>Down || Down</answer>")
    metadata = {"render_modes": ["text", "rgb_array"], "render_fps": 1}  # noqa: RUF012

    #: RAGEN v1's ``FrozenLakeEnvConfig`` defaults (the signature's are v2's)
    ragen_v1_defaults = {"p": 0.8, "success_rate": SUCCESS_RATE}  # noqa: RUF012
    #: RAGEN config keys accepted and unused: the map always follows the reset seed (RAGEN
    #: overwrote map_seed with it); its lookups only shape the prompt
    extra_kwargs = frozenset({"map_seed", "action_map", "map_lookup", "grid_lookup",
                                "grid_vocab", "action_lookup"})

    def __init__(self, size: int = 4, p: float = 0.9, is_slippery: bool = True,
                 success_rate: float = 0.8, observation_format: str = "grid",
                 **config: Any) -> None:
        super().__init__(size=size, p=p, is_slippery=is_slippery, success_rate=success_rate,
                         observation_format=observation_format, **config)
        self.size = int(size)
        self.p = float(p)
        self.is_slippery = bool(is_slippery)
        self.success_rate = float(success_rate)
        self.observation_format = check_format(observation_format)
        if self.size < 2 or not 0.0 < self.p <= 1.0 or not 0.0 <= self.success_rate <= 1.0:
            raise ValueError("frozen_lake needs size >= 2, 0 < p <= 1, 0 <= success_rate <= 1")
        self.desc: Desc = ()
        self.pos: Cell = (0, 0)

    def _reset(self, seed: int, options: dict[str, Any]) -> str:
        # RAGEN: the map from its own generator seeded with the reset seed, the moves from
        # gymnasium's env generator seeded with it too, whose reset draws once.
        self.desc = generate_map(np.random.default_rng(seed), self.size, self.p)
        self.pos = next((r, c) for r, row in enumerate(self.desc) for c, ch in enumerate(row)
                        if ch == "S")
        self.np_random.random()
        return self._text()

    @property
    def cell(self) -> str:
        """The map letter under the player."""
        return self.desc[self.pos[0]][self.pos[1]]

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if action is None:
            return self._text(), 0.0, self.cell in "HG", False, {
                "action_is_valid": False, "success": self.cell == "G"}
        # Every step draws once, as gymnasium does, even on a finished episode (which stays
        # where it is: RAGEN steps finished envs too).
        u = float(self.np_random.random())
        if self.cell in "HG":
            return self._text(), 0.0, True, False, {"success": self.cell == "G"}
        moves = _outcomes(int(action), self.is_slippery)
        move = moves[_sample(slip_cdf(self.success_rate), u)] if len(moves) > 1 else moves[0]
        before = self.pos
        self.pos = _moved(self.pos, move, self.size)
        on_goal = self.cell == "G"
        return self._text(), float(on_goal), self.cell in "HG", False, {
            "action_is_effective": self.pos != before, "success": on_goal}

    def _text(self) -> str:
        """The observation in ``observation_format`` (the grid, or RAGEN v2's coordinates)."""
        grid = self._render_text()
        if self.observation_format == "grid":
            return grid
        board = np.array([list(row) for row in self.desc])
        under = {"G": "Player on goal", "H": "Player in hole"}.get(self.cell, "Player")
        entities = [("Start", cells(board == "S")), ("Goal", cells(board == "G")),
                    (under, [self.pos]), ("Holes", cells(board == "H"))]
        return formatted(self.observation_format, grid, (self.size, self.size), entities)

    def _render_rgb_array(self) -> np.ndarray:
        """The board as a ``(size*16, size*16, 3)`` uint8 image (``render("rgb_array")``, as
        Sokoban's)."""
        if not self.desc:
            raise RuntimeError("call reset() before render()")
        return draw(self.desc, self.pos)

    def _render_text(self) -> str:
        symbols = {"F": "_", "S": "_", "H": "O", "G": "G"}
        rows = [[symbols[ch] for ch in row] for row in self.desc]
        if rows:
            r, c = self.pos
            rows[r][c] = {"H": "X", "G": "√"}.get(self.cell, "P")
        return "\n".join("".join(row) for row in rows)


# --------------------------------------------------------------------------- oracle
def parse_obs(obs: str) -> tuple[Desc, Cell, str] | None:
    """``(desc, player cell, symbol under the player)`` from an observation, or None."""
    if not isinstance(obs, str) or len(obs) > 10_000:
        return None
    rows = obs.strip("\n").split("\n")
    if len(rows) < 2 or any(len(row) != len(rows) for row in rows):
        return None
    letters = {"_": "F", "O": "H", "G": "G", "P": "F", "X": "H", "√": "G"}
    if any(ch not in letters for row in rows for ch in row):
        return None
    players = [(r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in "PX√"]
    if len(players) != 1:
        return None
    desc = tuple("".join(letters[ch] for ch in row) for row in rows)
    pos = players[0]
    return desc, pos, rows[pos[0]][pos[1]]


def draw(desc: Desc, pos: Cell) -> np.ndarray:
    """The ``rgb_array`` frame of a board with the player at ``pos``."""
    codes = np.array([[_HOLE if ch == "H" else _GOAL if ch == "G" else _ICE for ch in row]
                      for row in desc])
    codes[pos] += _PLAYER
    h, w = codes.shape
    return tiles()[codes].transpose(0, 2, 1, 3, 4).reshape(h * TILE, w * TILE, 3)


def frame_from_obs(obs: str, env_config: dict[str, Any] | None = None) -> np.ndarray:
    """The ``rgb_array`` frame of a grid observation text, drawn from the text alone (what
    the env's own ``render()`` draws), so a vector env draws frames where the texts are."""
    parsed = parse_obs(obs)
    if parsed is None:
        raise ValueError("not a FrozenLake grid observation (observation_format='grid' draws)")
    return draw(parsed[0], parsed[1])


def oracle(obs: str, env_config: dict[str, Any]) -> list[str]:
    """The next action name(s) from the observation text.

    Slippery ice: the one best action under value iteration. Otherwise: the whole shortest
    path. ``[]`` when the episode is over or the text is not a FrozenLake grid.
    """
    parsed = parse_obs(obs)
    if parsed is None:
        return []
    desc, pos, symbol = parsed
    if symbol != "P":
        return []
    if not env_config.get("is_slippery", True):
        path = _shortest_path(desc, pos)
        if path:
            return [ACTIONS[a] for a in path]
    policy, _ = optimal_policy(desc, bool(env_config.get("is_slippery", True)))
    return [ACTIONS[int(policy[pos])]]


FrozenLakeEnv.oracle = staticmethod(oracle)
FrozenLakeEnv.frame_from_obs = staticmethod(frame_from_obs)
