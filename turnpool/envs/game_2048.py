"""2048: slide the tiles of a square grid; equal tiles that meet merge into their sum.

RAGEN v2's ``game_2048`` (written from its rules, drawing the same numbers):

* the grid is ``size`` x ``size`` (4); a reset empties it and spawns two tiles; every move that
  changes the grid spawns one more: an empty cell picked by ``rng.integers(0, n_empty)`` in
  row-major order, then a 2 when ``rng.random() < two_prob`` (0.9) else a 4, from the env's
  generator seeded with the reset seed;
* actions 0 Up, 1 Right, 2 Down, 3 Left; a move compacts each line towards its side and merges
  each pair of equal neighbours once (the pair nearest that side first);
* the raw reward is the sum of the merged tiles, or ``-0.1`` for a move that changes nothing
  (then ``action_is_valid`` is False); with ``use_log_reward`` (the default) the reward is
  ``0.1 * log2(raw + 1)`` for a positive raw reward, else 0;
* the episode ends when no move changes the grid (``success`` when a tile reached 2048);
* ``info`` carries RAGEN's ``grid`` (int64 array), ``action_mask`` (bool per action),
  ``score`` (the running sum of merges), ``raw_reward``, and ``max_tile`` at the end.

An unparseable action changes nothing: reward 0, ``action_is_valid`` False.

Example:
    >>> env = Game2048Env()
    >>> obs, info = env.reset(seed=0)
    >>> obs.splitlines()[0], int(np.count_nonzero(info["grid"]))
    ('Current 2048 Grid:', 2)
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from turnpool.envs.base import TextEnv

ACTIONS: dict[int, str] = {0: "Up", 1: "Right", 2: "Down", 3: "Left"}
INVALID_MOVE_SCORE = -0.1

Grid = list[list[int]]


def _line_cells(size: int, action: int) -> list[list[tuple[int, int]]]:
    """Per line, its cells ordered from the side the tiles slide to."""
    near = range(size) if action in (0, 3) else range(size - 1, -1, -1)
    if action in (0, 2):  # vertical: one line per column
        return [[(r, c) for r in near] for c in range(size)]
    return [[(r, c) for c in near] for r in range(size)]


def slide(grid: Grid, action: int) -> tuple[Grid, int, bool]:
    """``(new grid, merged sum, whether anything moved)`` for one move."""
    size = len(grid)
    out = [row[:] for row in grid]
    total = 0
    for cells in _line_cells(size, action):
        values = [grid[r][c] for r, c in cells if grid[r][c]]
        merged: list[int] = []
        i = 0
        while i < len(values):
            if i + 1 < len(values) and values[i] == values[i + 1]:
                merged.append(values[i] * 2)
                total += values[i] * 2
                i += 2
            else:
                merged.append(values[i])
                i += 1
        merged += [0] * (size - len(merged))
        for (r, c), value in zip(cells, merged, strict=True):
            out[r][c] = value
    return out, total, out != grid


class Game2048Env(TextEnv):
    """2048 on a square grid; see the module docstring for the rules."""

    action_kind = "discrete"
    action_lookup = dict(ACTIONS)
    ragen_info_keys = ("action_is_effective", "action_is_valid", "success", "grid",
                       "action_mask", "score", "raw_reward", "max_tile")
    #: RAGEN's action_lookup (always its four moves) is accepted and unused
    extra_kwargs = frozenset({"action_lookup"})
    instruction = (
        "You are playing the 2048 game on a 4x4 grid. Merge equal tiles by sliding Up, Right, "
        "Down, or Left.\nIf a move is invalid (no tiles move), a small penalty is applied. "
        "Respond with a single action.\nExample: <answer>Up</answer>\n")

    def __init__(self, size: int = 4, two_prob: float = 0.9, use_log_reward: bool = True,
                 render_mode: str = "text", **config: Any) -> None:
        super().__init__(size=size, two_prob=two_prob, use_log_reward=use_log_reward,
                         render_mode=render_mode, **config)
        if int(size) < 2 or not 0.0 <= float(two_prob) <= 1.0:
            raise ValueError("game_2048 needs size >= 2 and 0 <= two_prob <= 1")
        self.size = int(size)
        self.two_prob = float(two_prob)
        self.use_log_reward = bool(use_log_reward)
        self.board: Grid = [[0] * self.size for _ in range(self.size)]
        self.score = 0

    @property
    def grid(self) -> np.ndarray:
        """The board as RAGEN's ``int64`` array (a copy)."""
        return np.array(self.board, dtype=np.int64).reshape(self.size, self.size)

    def _reset(self, seed: int, options: dict[str, Any]) -> str:
        self.board = [[0] * self.size for _ in range(self.size)]
        self.score = 0
        self._spawn()
        self._spawn()
        return self._render_text()

    def reset(self, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        obs, info = super().reset(seed=seed, options=options)
        info.update(grid=self.grid, score=self.score, action_mask=self.action_mask(),
                    raw_reward=0.0)
        return obs, info

    def _spawn(self) -> None:
        empties = [(r, c) for r in range(self.size) for c in range(self.size)
                   if not self.board[r][c]]
        if not empties:
            return
        r, c = empties[int(self.np_random.integers(0, len(empties)))]
        self.board[r][c] = 2 if self.np_random.random() < self.two_prob else 4

    def valid_actions(self) -> list[int]:
        """The moves that would change the grid, in id order."""
        return [a for a in ACTIONS if slide(self.board, a)[2]]

    def action_mask(self) -> np.ndarray:
        mask = np.zeros(4, dtype=bool)
        mask[self.valid_actions()] = True
        return mask

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if action is None:
            return self._render_text(), 0.0, False, False, {"action_is_valid": False}
        board, merged, moved = slide(self.board, int(action))
        info: dict[str, Any] = {"action_is_effective": moved, "action_is_valid": moved,
                                "success": False}
        terminated = False
        raw = INVALID_MOVE_SCORE
        if moved:
            self.board = board
            self._spawn()
            self.score += merged
            raw = float(merged)
            terminated = not self.valid_actions()
            if terminated:
                top = max(max(row) for row in self.board)
                info["max_tile"] = np.int64(top)
                info["success"] = top >= 2048
        reward = raw
        if self.use_log_reward:
            reward = float(np.log2(raw + 1.0)) * 0.1 if raw > 0 else 0.0
        info.update(grid=self.grid, action_mask=self.action_mask(), score=self.score,
                    raw_reward=raw)
        return self._render_text(), reward, terminated, False, info

    def _render_text(self) -> str:
        lines = ["Current 2048 Grid:"]
        lines += [f"Row {i + 1}: [{', '.join(str(v) for v in row)}]"
                  for i, row in enumerate(self.board)]
        valid = self.valid_actions()
        actions = ", ".join(f"{a}({ACTIONS[a]})" for a in valid) if valid else "None"
        lines += ["", f"Valid Actions: {actions}.", "Goal: Merge same numbers to reach 2048.",
                  f"Current Score: {self.score}", "What is your next move?"]
        return "\n".join(lines)


# --------------------------------------------------------------------------- oracle
_ROW = re.compile(r"^Row \d+: \[([\d, ]*)\]$", re.MULTILINE)


def read_board(obs: str) -> Grid | None:
    """The grid on the page, or None."""
    rows = [[int(v) for v in m.split(",")] for m in _ROW.findall(obs) if m.strip()]
    if not rows or any(len(r) != len(rows) for r in rows):
        return None
    return rows


def _value(grid: Grid) -> float:
    """How promising a grid is: empty cells, and rows and columns that fall away from the
    top-left corner (where the largest tile is kept)."""
    size = len(grid)
    empty = sum(1 for row in grid for v in row if not v)
    mono = 0.0
    for line in [*grid, *([grid[r][c] for r in range(size)] for c in range(size))]:
        mono -= sum(max(0, b - a) for a, b in zip(line, line[1:]))
    corner = grid[0][0] if grid[0][0] == max(max(row) for row in grid) else 0
    return 4.0 * empty * max(1, max(max(row) for row in grid)) ** 0.5 + mono + 2.0 * corner


def _expected(grid: Grid) -> float:
    """The value after the spawn of a 2 in each empty cell, the best reply then, averaged."""
    size = len(grid)
    empties = [(r, c) for r in range(size) for c in range(size) if not grid[r][c]]
    if not empties:
        return _value(grid)
    total = 0.0
    for r, c in empties:
        grid[r][c] = 2
        total += max((_value(g) + merged for g, merged, moved in
                      (slide(grid, a) for a in ACTIONS) if moved), default=-1e9)
        grid[r][c] = 0
    return total / len(empties)


def oracle(obs: str, env_config: dict[str, Any]) -> list[str]:
    """One move: the one whose spawned-on grid looks best two plies ahead (a heuristic, not a
    solver: 2048 draws its tiles at random); ``[]`` when no move changes the grid."""
    grid = read_board(obs)
    if grid is None:
        return []
    scored = [(merged + _expected(g), -a) for a in ACTIONS
              for g, merged, moved in [slide(grid, a)] if moved]
    return [ACTIONS[-max(scored)[1]]] if scored else []


Game2048Env.oracle = staticmethod(oracle)
