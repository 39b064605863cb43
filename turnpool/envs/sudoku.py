"""Sudoku with feedback: place numbers one at a time until the grid is full and conflict-free.

RAGEN v2's ``sudoku`` (written from its rules, drawing the same numbers; RAGEN seeds the
process-global ``random`` with the reset seed, here a ``random.Random(seed)`` of the env's own
makes the same draws):

* the solution fills the cells row-major by backtracking, trying at each cell the numbers
  ``1..n`` in an order shuffled afresh for each try; then all ``n * n`` cells are shuffled and
  the first 40% / 50% / 60% (``difficulty`` easy / medium / hard) emptied;
* an action is text: ``place N at row R col C``, ``place N at (R,C)``, ``place N at R,C``,
  ``N at R,C``, ``(R,C,N)`` or ``R,C,N`` (1-based; the first matching pattern wins, and the
  number comes first whenever the text contains ``place`` or ``at``);
* an unparseable action, an initial cell or a number already in the row, column or box is
  invalid: reward ``invalid_action_score`` (-0.1), the episode goes on; a valid placement pays
  ``correct_placement_score`` (1.0) when it is the solution's number, half of it otherwise,
  plus ``completion_bonus`` (10.0) when the grid is solved; every step counts towards
  ``max_steps``, but only valid placements end an episode;
* ``render_format`` ``simple`` / ``detailed`` / ``with_feedback`` as RAGEN renders them.

Example:
    >>> env = SudokuEnv(grid_size=4)
    >>> obs, _ = env.reset(seed=1)
    >>> env.step("9,9,9")[4]["error"]
    'Row 9 is out of range (1-4)'
"""

from __future__ import annotations

import random
import re
from typing import Any

import numpy as np

from turnpool.envs.base import TextEnv

DIFFICULTY_REMOVED = {"easy": 0.4, "medium": 0.5, "hard": 0.6}
RENDER_FORMATS = ("simple", "detailed", "with_feedback")
#: Longer action texts are not parsed (LLM text is hostile input).
MAX_ACTION_CHARS = 4_096
_PATTERNS = tuple(re.compile(p) for p in (
    r"place\s+(\d+)\s+at\s+row\s+(\d+)\s+col\s+(\d+)",
    r"place\s+(\d+)\s+at\s+\((\d+),\s*(\d+)\)",
    r"place\s+(\d+)\s+at\s+(\d+),\s*(\d+)",
    r"(\d+)\s+at\s+(\d+),\s*(\d+)",
    r"\((\d+),\s*(\d+),\s*(\d+)\)",
    r"(\d+),\s*(\d+),\s*(\d+)",
))
LEGEND = "Legend: [N]=initial cell, N=user-placed, *N*=conflict, .=empty"

Grid = list[list[int]]


def generate(rng: random.Random, size: int, difficulty: str) -> tuple[Grid, Grid]:
    """``(puzzle, solution)`` drawn from ``rng`` (see the module docstring)."""
    box = int(size ** 0.5)
    grid = [[0] * size for _ in range(size)]

    def fill(cell: int) -> bool:
        if cell == size * size:
            return True
        r, c = divmod(cell, size)
        numbers = list(range(1, size + 1))
        rng.shuffle(numbers)
        for n in numbers:
            if allowed(grid, r, c, n, box):
                grid[r][c] = n
                if fill(cell + 1):
                    return True
                grid[r][c] = 0
        return False

    fill(0)
    puzzle = [row[:] for row in grid]
    cells = [(i, j) for i in range(size) for j in range(size)]
    rng.shuffle(cells)
    for r, c in cells[:int(size * size * DIFFICULTY_REMOVED[difficulty])]:
        puzzle[r][c] = 0
    return puzzle, grid


def allowed(grid: Grid, r: int, c: int, n: int, box: int) -> bool:
    """Whether ``n`` is in none of the row, the column and the box of ``(r, c)``."""
    br, bc = r // box * box, c // box * box
    return (n not in grid[r] and all(row[c] != n for row in grid)
            and all(grid[i][j] != n for i in range(br, br + box) for j in range(bc, bc + box)))


def candidates(grid: Grid, r: int, c: int, box: int) -> list[int]:
    """The numbers that may go into the empty cell ``(r, c)``, ascending."""
    if grid[r][c]:
        return []
    return [n for n in range(1, len(grid) + 1) if allowed(grid, r, c, n, box)]


def conflicts(grid: Grid, box: int) -> set[tuple[int, int]]:
    """Cells whose number repeats in their row, column or box."""
    size = len(grid)
    units = [[(r, c) for c in range(size)] for r in range(size)]
    units += [[(r, c) for r in range(size)] for c in range(size)]
    units += [[(br + i, bc + j) for i in range(box) for j in range(box)]
              for br in range(0, size, box) for bc in range(0, size, box)]
    out: set[tuple[int, int]] = set()
    for unit in units:
        seen: dict[int, list[tuple[int, int]]] = {}
        for r, c in unit:
            if grid[r][c]:
                seen.setdefault(grid[r][c], []).append((r, c))
        out.update(cell for cells in seen.values() if len(cells) > 1 for cell in cells)
    return out


class SudokuEnv(TextEnv):
    """Sudoku; see the module docstring for the rules."""

    action_kind = "free_text"
    ragen_info_keys = ("action_is_effective", "action_is_valid", "success", "error",
                       "valid_numbers", "correct_placement", "steps_remaining",
                       "cells_filled", "cells_remaining")
    #: RAGEN's show_candidates is accepted and unused (its env never reads it either)
    extra_kwargs = frozenset({"show_candidates"})

    def __init__(self, grid_size: int = 9, max_steps: int = 81, difficulty: str = "easy",
                 render_format: str = "detailed", show_conflicts: bool = True,
                 show_valid_numbers: bool = True, correct_placement_score: float = 1.0,
                 invalid_action_score: float = -0.1, completion_bonus: float = 10.0,
                 render_mode: str = "text", **config: Any) -> None:
        super().__init__(grid_size=grid_size, max_steps=max_steps, difficulty=difficulty,
                         render_format=render_format, render_mode=render_mode, **config)
        if grid_size not in (4, 9, 16) or difficulty not in DIFFICULTY_REMOVED \
                or render_format not in RENDER_FORMATS:
            raise ValueError("sudoku needs grid_size 4, 9 or 16, difficulty easy / medium / "
                             f"hard and render_format one of {RENDER_FORMATS}")
        self.grid_size = int(grid_size)
        self.box = int(self.grid_size ** 0.5)
        self.max_steps = int(max_steps)
        self.difficulty = difficulty
        self.render_format = render_format
        self.show_conflicts = bool(show_conflicts)
        self.show_valid_numbers = bool(show_valid_numbers)
        self.correct_placement_score = float(correct_placement_score)
        self.invalid_action_score = float(invalid_action_score)
        self.completion_bonus = float(completion_bonus)
        self.initial: Grid = []
        self.solution: Grid = []
        self.current: Grid = []
        self.num_steps = 0
        self.feedback = ""

    def _reset(self, seed: int, options: dict[str, Any]) -> str:
        self.initial, self.solution = generate(random.Random(seed), self.grid_size,
                                               self.difficulty)
        self.current = [row[:] for row in self.initial]
        self.num_steps = 0
        self.feedback = ""
        return self._render_text()

    def parse_move(self, action: str) -> tuple[int, int, int] | str:
        """``(row, col, number)`` 0-based row and column, or RAGEN's error text."""
        text = action.strip().lower()
        match = None
        if len(text) <= MAX_ACTION_CHARS:
            match = next((m for p in _PATTERNS if (m := p.search(text))), None)
        if match is None:
            return (f"Could not parse action: '{text[:MAX_ACTION_CHARS]}'. Expected format: "
                    "'place 5 at row 2 col 3' or '2,3,5'")
        a, b, c = (int(g) for g in match.groups())
        num, row, col = (a, b, c) if "place" in text or "at" in text else (c, a, b)
        n = self.grid_size
        if not 1 <= row <= n:
            return f"Row {row} is out of range (1-{n})"
        if not 1 <= col <= n:
            return f"Column {col} is out of range (1-{n})"
        if not 1 <= num <= n:
            return f"Number {num} is out of range (1-{n})"
        return row - 1, col - 1, num

    def _invalid(self, feedback: str, error: str, **extra: Any
                 ) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.feedback = feedback
        return self._render_text(), self.invalid_action_score, False, False, {
            "action_is_effective": False, "action_is_valid": False, "success": False,
            "error": error, **extra}

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.num_steps += 1
        move = self.parse_move(action if isinstance(action, str) else str(action))
        if isinstance(move, str):
            return self._invalid(f"❌ Invalid action format: {move}", move)
        row, col, num = move
        where = f"({row + 1},{col + 1})"
        if self.initial[row][col]:
            return self._invalid(f"❌ Cannot modify initial cell at {where}",
                                 "Cannot modify initial cells")
        grid, box = self.current, self.box
        if not allowed(grid, row, col, num, box):
            br, bc = row // box * box, col // box * box
            clash = [f"row {row + 1}"] if num in grid[row] else []
            clash += [f"column {col + 1}"] if any(r[col] == num for r in grid) else []
            clash += [f"box ({br // box + 1},{bc // box + 1})"] if any(
                grid[i][j] == num for i in range(br, br + box) for j in range(bc, bc + box)
            ) else []
            text = ", ".join(clash)
            feedback = f"❌ Invalid placement: {num} conflicts with {text}"
            valid = candidates(grid, row, col, box)
            if valid:
                feedback += f"\n   Valid numbers for {where}: {valid}"
            return self._invalid(feedback, f"Number {num} conflicts with {text}",
                                 valid_numbers=valid)
        grid[row][col] = num
        correct = num == self.solution[row][col]
        reward = self.correct_placement_score * (1.0 if correct else 0.5)
        self.feedback = (f"✓ Correct! Placed {num} at {where}" if correct
                         else f"⚠ Placed {num} at {where} - Valid but not optimal")
        filled = sum(1 for r in grid for v in r if v)
        solved = filled == self.grid_size ** 2 and not conflicts(grid, box)
        if solved:
            self.feedback += "\n🎉 Congratulations! Puzzle solved!"
            reward += self.completion_bonus
        return self._render_text(), reward, solved, not solved and \
            self.num_steps >= self.max_steps, {
                "action_is_effective": True, "action_is_valid": True, "success": solved,
                "correct_placement": correct, "steps_remaining": self.max_steps - self.num_steps,
                "cells_filled": filled, "cells_remaining": self.grid_size ** 2 - filled}

    # ------------------------------------------------------------------ rendering
    def _render_text(self) -> str:
        if self.render_format == "simple":
            return self._grid_simple()
        clashes = conflicts(self.current, self.box)
        out = ["=" * 50, "SUDOKU PUZZLE", "=" * 50, self._grid_marked(clashes), "", LEGEND]
        if self.feedback:
            out += ["", self.feedback]
        if self.render_format == "with_feedback":
            out += self._feedback_sections(clashes)
        return "\n".join(out)

    def _feedback_sections(self, clashes: set[tuple[int, int]]) -> list[str]:
        grid, n = self.current, self.grid_size
        out: list[str] = []
        if self.show_conflicts and clashes:
            out += ["", "⚠ CONFLICTS DETECTED:"]
            out += [f"  - Cell ({r + 1},{c + 1}): {grid[r][c]}" for r, c in sorted(clashes)]
        empty = [(r, c) for r in range(n) for c in range(n) if not grid[r][c]]
        if self.show_valid_numbers and empty and len(empty) <= 10:
            out += ["", "💡 VALID NUMBERS FOR EMPTY CELLS:"]
            for r, c in empty:
                valid = candidates(grid, r, c, self.box) if not self.initial[r][c] else []
                if valid:
                    out.append(f"  - ({r + 1},{c + 1}): {valid}")
        filled = n * n - len(empty)
        initial = sum(1 for row in self.initial for v in row if v)
        out += ["", f"Progress: {filled}/{n * n} cells filled ({initial} initial, "
                    f"{filled - initial} placed)", f"Steps: {self.num_steps}/{self.max_steps}"]
        return out

    def _grid_simple(self) -> str:
        lines = []
        for i, row in enumerate(self.current):
            if i and i % self.box == 0:
                lines.append("-" * (self.grid_size * 2 + self.box - 1))
            cells = "".join(("| " if j and j % self.box == 0 else "") + (str(v) if v else ".")
                            + " " for j, v in enumerate(row))
            lines.append(cells.rstrip())
        return "\n".join(lines)

    def _grid_marked(self, clashes: set[tuple[int, int]]) -> str:
        lines = []
        for i, row in enumerate(self.current):
            if i and i % self.box == 0:
                lines.append("-" * (self.grid_size * 3 + self.box - 1))
            cells = ""
            for j, v in enumerate(row):
                cells += "| " if j and j % self.box == 0 else ""
                cells += (" . " if not v else f"[{v}]" if self.initial[i][j]
                          else f"*{v}*" if (i, j) in clashes else f" {v} ")
            lines.append(cells.rstrip())
        return "\n".join(lines)

    @property
    def grid(self) -> np.ndarray:
        """The current grid as an array (0 = empty)."""
        return np.array(self.current, dtype=np.int64)


# --------------------------------------------------------------------------- oracle
_CELL = re.compile(r"\[(\d+)\]|\*(\d+)\*|(\d+)|(\.)")
_GRID_LINE = re.compile(r"^[\s\d.\[\]*|]+$")
#: the solver's search budget (guesses), so a 16x16 grid cannot take minutes
MAX_SOLVER_NODES = 200_000


def read_grid(obs: str, size: int) -> tuple[Grid, Grid] | None:
    """``(current, initial)`` from an observation (``simple`` marks no initial cells: then
    both are the current grid), or None when no ``size`` x ``size`` grid is on the page."""
    rows: list[list[int]] = []
    givens: list[list[int]] = []
    for line in obs.splitlines():
        if not line.strip() or not _GRID_LINE.match(line) or set(line.strip()) <= {"-"}:
            continue
        cells = _CELL.findall(line)
        if len(cells) != size:
            continue
        rows.append([int(a or b or c or 0) for a, b, c, _ in cells])
        givens.append([int(a) if a else 0 for a, _, _, _ in cells])
        if len(rows) == size:
            break
    if len(rows) != size:
        return None
    marked = any(v for row in givens for v in row)
    return rows, (givens if marked else [row[:] for row in rows])


def solve(grid: Grid, max_nodes: int = MAX_SOLVER_NODES) -> Grid | None:
    """A completion of ``grid`` by backtracking (fewest candidates first), or None."""
    size = len(grid)
    box = int(size ** 0.5)
    work = [row[:] for row in grid]
    budget = [max_nodes]

    def search() -> bool:
        best: tuple[int, int, list[int]] | None = None
        for r in range(size):
            for c in range(size):
                if not work[r][c]:
                    options = candidates(work, r, c, box)
                    if best is None or len(options) < len(best[2]):
                        best = (r, c, options)
        if best is None:
            return True
        r, c, options = best
        for n in options:
            budget[0] -= 1
            if budget[0] < 0:
                return False
            work[r][c] = n
            if search():
                return True
        work[r][c] = 0
        return False

    if conflicts(work, box) or not search():
        return None
    return work


def oracle(obs: str, env_config: dict[str, Any]) -> list[str]:
    """Placements that complete the grid on the page: solved with every placed number kept,
    else from the initial cells only (overwriting wrong placements first: a placement the
    env refuses is planned again next turn); ``[]`` when no grid."""
    read = read_grid(obs, int(env_config.get("grid_size", 9)))
    if read is None:
        return []
    current, initial = read
    solution = solve(current) or solve(initial)
    if solution is None:
        return []
    cells = [(r, c) for r in range(len(current)) for c in range(len(current))
             if current[r][c] != solution[r][c]]
    cells.sort(key=lambda rc: not current[rc[0]][rc[1]])  # wrong numbers out of the way first
    return [f"place {solution[r][c]} at row {r + 1} col {c + 1}" for r, c in cells]


SudokuEnv.oracle = staticmethod(oracle)
