"""Rubik's cube 2x2 (pocket cube): restore one colour per face with quarter turns.

RAGEN v2's ``rubikscube`` (written from its rules, drawing the same numbers):

* 24 stickers, four per face in the order U, L, F, R, B, D (colours W, O, G, R, B, Y, one per
  face when solved); a reset scrambles the solved cube with ``scramble_depth`` (5) turns drawn
  by ``rng.integers(1, 13)`` from the env's generator seeded with the reset seed;
* actions 1 U, 2 U', 3 D, 4 D', 5 L, 6 L', 7 R, 8 R', 9 F, 10 F', 11 B, 12 B' (a prime turn is
  three clockwise turns); every step counts;
* reward 1.0 when every face shows one colour (``success``), else 0.0; the episode ends when
  solved or after ``max_steps`` (20) steps.

An unparseable action changes nothing and does not count: reward 0, ``action_is_valid`` False.

Example:
    >>> env = RubiksCube2x2Env(scramble_depth=1)
    >>> obs, _ = env.reset(seed=0)
    >>> obs.splitlines()[0]
    "=== Rubik's Cube 2x2 State ==="
"""

from __future__ import annotations

import re
from typing import Any

from turnpool.envs.base import TextEnv

ACTIONS: dict[int, str] = {1: "U", 2: "U'", 3: "D", 4: "D'", 5: "L", 6: "L'", 7: "R", 8: "R'",
                           9: "F", 10: "F'", 11: "B", 12: "B'"}
FACES = (("Up (U):    ", 0), ("Left (L):  ", 1), ("Front (F): ", 2), ("Right (R): ", 3),
         ("Back (B):  ", 4), ("Down (D):  ", 5))
COLOURS = "WOGRBY"

#: One clockwise quarter turn per face letter, as cycles of sticker positions: each position
#: takes the sticker of the next one in its cycle (the face's own 4-cycle, then its ring).
_CYCLES: dict[str, tuple[tuple[int, ...], ...]] = {
    "U": ((0, 2, 3, 1), (8, 12, 16, 4), (9, 13, 17, 5)),
    "D": ((20, 22, 23, 21), (10, 6, 18, 14), (11, 7, 19, 15)),
    "L": ((4, 6, 7, 5), (0, 19, 20, 8), (2, 17, 22, 10)),
    "R": ((12, 14, 15, 13), (1, 9, 21, 18), (3, 11, 23, 16)),
    "F": ((8, 10, 11, 9), (2, 7, 21, 12), (3, 5, 20, 14)),
    "B": ((16, 18, 19, 17), (0, 13, 22, 6), (1, 15, 23, 4)),
}


def _permutation(face: str) -> tuple[int, ...]:
    """``new[i] = old[perm[i]]`` for one clockwise turn of ``face``."""
    perm = list(range(24))
    for cycle in _CYCLES[face]:
        for i, pos in enumerate(cycle):
            perm[pos] = cycle[(i + 1) % len(cycle)]
    return tuple(perm)


def _compose(times: int, perm: tuple[int, ...]) -> tuple[int, ...]:
    out = tuple(range(24))
    for _ in range(times):
        out = tuple(out[p] for p in perm)
    return out


#: action id -> sticker permutation
MOVES: dict[int, tuple[int, ...]] = {
    a: _compose(3 if a % 2 == 0 else 1, _permutation(ACTIONS[a][0])) for a in ACTIONS}


def turn(stickers: list[int], action: int) -> list[int]:
    """The stickers after one action."""
    return [stickers[p] for p in MOVES[action]]


def solved(stickers: list[int]) -> bool:
    return all(len(set(stickers[4 * f:4 * f + 4])) == 1 for f in range(6))


class RubiksCube2x2Env(TextEnv):
    """Pocket cube; see the module docstring for the rules."""

    action_kind = "discrete"
    action_lookup = dict(ACTIONS)
    ragen_info_keys = ("action_is_effective", "action_is_valid", "success")
    #: RAGEN's action_lookup (always its twelve turns) is accepted and unused
    extra_kwargs = frozenset({"action_lookup"})
    instruction = (
        "You are solving a 2x2 Rubik's Cube (Pocket Cube). The goal is to restore the cube so "
        "that each of the faces consists of a single, unique color.\nAvailable actions use "
        "standard Singmaster notation for face rotations: U, U', D, D', L, L', R, R', F, F', B, "
        "B'.\n")

    def __init__(self, scramble_depth: int = 5, max_steps: int = 20,
                 render_mode: str = "text", **config: Any) -> None:
        super().__init__(scramble_depth=scramble_depth, max_steps=max_steps,
                         render_mode=render_mode, **config)
        if int(scramble_depth) < 0 or int(max_steps) < 1:
            raise ValueError("rubikscube needs scramble_depth >= 0 and max_steps >= 1")
        self.scramble_depth = int(scramble_depth)
        self.max_steps = int(max_steps)
        self.stickers = [i // 4 for i in range(24)]
        self.current_step = 0

    def _reset(self, seed: int, options: dict[str, Any]) -> str:
        self.stickers = [i // 4 for i in range(24)]
        self.current_step = 0
        for _ in range(self.scramble_depth):
            self.stickers = turn(self.stickers, int(self.np_random.integers(1, 13)))
        return self._text(done=False)

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if action is None:
            return self._text(done=False), 0.0, False, False, {"action_is_valid": False}
        self.stickers = turn(self.stickers, int(action))
        self.current_step += 1
        is_solved = solved(self.stickers)
        truncated = self.current_step >= self.max_steps
        message = "Cube Solved!" if is_solved else "Max steps reached." if truncated else ""
        done = is_solved or truncated
        return self._text(done, message), float(is_solved), is_solved, truncated and not \
            is_solved, {"action_is_effective": True, "success": is_solved}

    def _render_text(self) -> str:
        return self._text(done=False)

    def _text(self, done: bool, message: str = "") -> str:
        lines = ["=== Rubik's Cube 2x2 State ===", f"Step: {self.current_step}/{self.max_steps}",
                 ""]
        for label, face in FACES:
            c = [COLOURS[s] for s in self.stickers[4 * face:4 * face + 4]]
            lines.append(f"{label}[{c[0]}, {c[1]}]\n [{c[2]}, {c[3]}]")
        if done:
            lines += ["", f"=== Game Over: {message} ==="]
        else:
            lines += ["", "Available Actions:", "U, U', D, D', L, L', R, R', F, F', B, B'",
                      "\nWhat is your next move?"]
        return "\n".join(lines)


# --------------------------------------------------------------------------- oracle
#: the deepest solution the oracle looks for (the default scramble is 5 turns)
MAX_SOLVE_DEPTH = 7
#: nodes the search may visit before it gives up (a few seconds at worst)
MAX_SOLVE_NODES = 2_000_000
_INVERSE = {a: a + 1 if a % 2 else a - 1 for a in ACTIONS}


def read_stickers(obs: str) -> list[int] | None:
    """The 24 stickers (as colour indices) of the state on the page, or None."""
    stickers: list[int] = []
    for label, _ in FACES:
        match = re.search(re.escape(label.strip()) + r"\s*\[(\w), (\w)\]\s*\[(\w), (\w)\]", obs)
        if match is None or any(ch not in COLOURS for ch in match.groups()):
            return None
        stickers += [COLOURS.index(ch) for ch in match.groups()]
    return stickers


def solve_moves(stickers: list[int], max_depth: int = MAX_SOLVE_DEPTH,
                max_nodes: int = MAX_SOLVE_NODES) -> list[int] | None:
    """A shortest action sequence that solves the cube (iterative deepening), or None."""
    budget = [max_nodes]
    path: list[int] = []

    def dfs(state: list[int], depth: int) -> bool:
        if solved(state):
            return True
        if depth == 0:
            return False
        for action in ACTIONS:
            if path and action == _INVERSE[path[-1]]:
                continue
            if len(path) >= 2 and path[-1] == path[-2] == action:  # three = one inverse
                continue
            budget[0] -= 1
            if budget[0] < 0:
                return False
            path.append(action)
            if dfs(turn(state, action), depth - 1):
                return True
            path.pop()
        return False

    for depth in range(max_depth + 1):
        if dfs(stickers, depth):
            return path
        if budget[0] < 0:
            break
    return None


def oracle(obs: str, env_config: dict[str, Any]) -> list[str]:
    """The turns of a shortest solution of the state on the page (``[]`` if none found)."""
    stickers = read_stickers(obs)
    moves = None if stickers is None else solve_moves(stickers)
    return [ACTIONS[a] for a in moves or []]


RubiksCube2x2Env.oracle = staticmethod(oracle)
