"""Sokoban room generation by reverse play (the gym_sokoban / RAGEN algorithm, re-implemented).

A room is built in four stages, all drawing from one ``numpy.random.Generator``:

1. *topology*: a random walk of ``int(1.7 * (h + w))`` steps from a random interior cell,
   turning with probability 0.35 and stamping one of five small floor masks at every step; the
   border is wall;
2. *placement*: the player and ``num_boxes`` targets on distinct random floor cells;
3. *reverse play*: starting with every box on its target, a depth-first search over "pull"
   moves (the player steps away from an adjacent box and drags it along). States are
   deduplicated by (player, box cells); the state with the best score, ``box swaps x total
   box-target Manhattan distance`` (0 while any box sits on a target), becomes the room.
   A score of 0 means the attempt failed;
4. *jitter*: the player takes up to three random steps (probability 0.8 when the total
   displacement is 1, else 0.5), so it does not always start next to a box.

Every pull is a push played backwards, so every room is solvable by construction.

Why this is much faster than the original: the search state is ``(player cell, bitmask of box
cells)`` over a fixed wall/target layout, moves come from a precomputed neighbour table, and the
score is updated incrementally; the original copies and serializes the whole grid at every
state. Failed attempts are retried with generators derived from ``SeedSequence([seed,
attempt])``, so a seed names one room in every process (RAGEN re-seeded with ``hash()``,
which differs between processes).

Example:
    >>> room, failures = generate(7, (6, 6), num_boxes=1)
    >>> len(room.boxes), room.player not in room.boxes
    (1, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

#: Stamped around the walk position at each step: (row, col) offsets of the floor cells.
_MASKS: tuple[tuple[tuple[int, int], ...], ...] = (
    ((0, -1), (0, 0), (0, 1)),
    ((-1, 0), (0, 0), (1, 0)),
    ((0, -1), (0, 0), (1, 0)),
    ((0, -1), (0, 0), (1, -1), (1, 0)),
    ((0, 0), (0, 1), (1, 0)),
)
_WALK_DIRECTIONS = ((1, 0), (0, 1), (-1, 0), (0, -1))
P_CHANGE_DIRECTION = 0.35
#: Reverse play stops after exploring this many distinct states (a bound on work).
MAX_STATES = 300_000
#: Attempts (topology + placement + reverse play) before ``generate`` gives up.
MAX_ATTEMPTS = 1_000


@dataclass(frozen=True)
class Room:
    """An immutable room. Cells are flat indices ``row * width + col``; border cells are walls."""

    height: int
    width: int
    walls: bytes
    targets: tuple[int, ...]
    boxes: tuple[int, ...]
    player: int

    def deltas(self) -> tuple[int, int, int, int]:
        """Flat offsets of Up, Down, Left, Right."""
        return (-self.width, self.width, -1, 1)


class GenerationFailed(Exception):
    """One attempt produced no usable room (too little floor, or every box stuck on a target)."""


def num_gen_steps(height: int, width: int) -> int:
    """Length of the topology random walk."""
    return int(1.7 * (height + width))


def validate(height: int, width: int, num_boxes: int) -> None:
    """Reject configurations that can never produce a room."""
    if height < 3 or width < 3:
        raise ValueError(f"dim_room must be at least (3, 3), got ({height}, {width})")
    if num_boxes < 1:
        raise ValueError(f"num_boxes must be >= 1, got {num_boxes}")
    if (height - 2) * (width - 2) < num_boxes + 2:
        raise ValueError(f"a {height}x{width} room has too few inner cells for {num_boxes} "
                         "boxes, their targets and the player")


# ----------------------------------------------------------------------------- stages
def _pick(u: float, n: int) -> int:
    """An index in ``range(n)`` from a uniform draw ``u`` in [0, 1)."""
    return min(int(u * n), n - 1)


def topology(rng: np.random.Generator, height: int, width: int, steps: int) -> bytearray:
    """Floor flags (1 floor, 0 wall) from a random walk; the border stays wall."""
    # One vector draw for the whole walk: numpy's per-call overhead dwarfs the walk itself.
    u = rng.random(3 + 3 * steps).tolist()
    dr, dc = _WALK_DIRECTIONS[_pick(u[0], 4)]
    r, c = 1 + _pick(u[1], height - 1), 1 + _pick(u[2], width - 1)
    floor = bytearray(height * width)
    for s in range(3, 3 + 3 * steps, 3):
        if u[s] < P_CHANGE_DIRECTION:
            dr, dc = _WALK_DIRECTIONS[_pick(u[s + 1], 4)]
        r = min(max(r + dr, 1), height - 2)
        c = min(max(c + dc, 1), width - 2)
        for mr, mc in _MASKS[_pick(u[s + 2], len(_MASKS))]:
            floor[(r + mr) * width + c + mc] = 1
    for col in range(width):
        floor[col] = floor[(height - 1) * width + col] = 0
    for row in range(height):
        floor[row * width] = floor[row * width + width - 1] = 0
    return floor


def place(rng: np.random.Generator, floor: bytearray, num_boxes: int
          ) -> tuple[int, tuple[int, ...]]:
    """``(player, targets)`` on distinct random floor cells."""
    cells = [p for p, f in enumerate(floor) if f]
    if len(cells) < num_boxes + 2:
        raise GenerationFailed(f"{len(cells)} floor cells for {num_boxes} boxes and a player")
    picked = [cells.pop(_pick(u, len(cells))) for u in rng.random(num_boxes + 1).tolist()]
    return picked[0], tuple(sorted(picked[1:]))


@lru_cache(maxsize=64)
def _coords(height: int, width: int) -> tuple[tuple[int, int], ...]:
    return tuple(divmod(p, width) for p in range(height * width))


def reverse_play(height: int, width: int, walls: bytes, targets: tuple[int, ...], player: int,
                 search_depth: int, max_states: int = MAX_STATES
                 ) -> tuple[int, int, tuple[int, ...]]:
    """Pull boxes off their targets; ``(best score, player, box cells by target)``.

    Depth-first over pull moves, at most ``search_depth`` moves deep, each distinct state
    visited once (the first time it is reached), at most ``max_states`` states in all.
    """
    n_cells = height * width
    deltas = (-width, width, -1, 1)
    # cell -> ((step-to cell, cell behind the player), ...) for moves that do not hit a wall
    moves: list[tuple[tuple[int, int], ...]] = [
        () if walls[p] else tuple((p + d, p - d) for d in deltas if not walls[p + d])
        for p in range(n_cells)]
    coords = _coords(height, width)
    dist = [[abs(r - coords[t][0]) + abs(c - coords[t][1]) for r, c in coords]
            for t in targets]
    target_mask = 0
    for t in targets:
        target_mask |= 1 << t
    shift = n_cells.bit_length()

    best_score, best_player, best_boxes = 0, player, targets
    seen: set[int] = set()
    # (player, boxes by target index, box bitmask, last pulled box, swaps, total dist, depth)
    stack: list[tuple[int, tuple[int, ...], int, int, int, int, int]] = [
        (player, targets, target_mask, -1, 0, 0, 0)]
    pop, push, mark = stack.pop, stack.append, seen.add
    while stack:
        p, boxes, mask, last, swaps, total, depth = pop()
        key = (mask << shift) | p
        if key in seen:
            continue
        if len(seen) >= max_states:
            break
        mark(key)
        if not mask & target_mask:
            score = swaps * total
            if score > best_score:
                best_score, best_player, best_boxes = score, p, boxes
        if depth >= search_depth:
            continue
        depth += 1
        # reversed, so the first direction is explored first (as a recursive search would)
        for q, behind in reversed(moves[p]):
            if mask >> q & 1:
                continue
            if mask >> behind & 1:
                i = boxes.index(behind)
                push((q, boxes[:i] + (p,) + boxes[i + 1:], mask ^ (1 << behind) ^ (1 << p), i,
                      swaps + (i != last), total + dist[i][p] - dist[i][behind], depth))
            else:
                push((q, boxes, mask, last, swaps, total, depth))
    return best_score, best_player, best_boxes


def jitter(rng: np.random.Generator, width: int, walls: bytes, boxes: tuple[int, ...],
           player: int, displacement: int) -> int:
    """Up to three random steps onto free, not yet visited cells; the new player cell."""
    if rng.random() >= (0.8 if displacement == 1 else 0.5):
        return player
    visited = {player}
    for step in range(3):
        options = [q for q in (player - width, player + width, player - 1, player + 1)
                   if not walls[q] and q not in boxes and q not in visited]
        if not options:
            break
        player = options[_pick(rng.random(), len(options))]
        visited.add(player)
        if step == 2 or rng.random() >= 0.5:
            break
    return player


# ----------------------------------------------------------------------------- driver
def attempt(rng: np.random.Generator, dim: tuple[int, int], num_boxes: int,
            search_depth: int, max_states: int = MAX_STATES) -> Room:
    """One try at a room; raises `GenerationFailed` when it yields none."""
    height, width = dim
    floor = topology(rng, height, width, num_gen_steps(height, width))
    player, targets = place(rng, floor, num_boxes)
    walls = bytes(1 - f for f in floor)
    score, player, boxes = reverse_play(height, width, walls, targets, player, search_depth,
                                        max_states)
    if score <= 0:
        raise GenerationFailed("reverse play could not move every box off its target")
    displacement = sum(abs(b // width - t // width) + abs(b % width - t % width)
                       for b, t in zip(boxes, targets))
    player = jitter(rng, width, walls, boxes, player, displacement)
    return Room(height, width, walls, targets, tuple(sorted(boxes)), player)


def generate(seed: int, dim: tuple[int, int], num_boxes: int = 1, search_depth: int = 300,
             rng: np.random.Generator | None = None, max_attempts: int = MAX_ATTEMPTS,
             max_states: int = MAX_STATES) -> tuple[Room, int]:
    """A room for ``seed``; ``(room, failed attempts)``.

    The first attempt draws from ``rng`` (default ``default_rng(seed)``); attempt ``k > 0``
    from ``default_rng(SeedSequence([seed, k]))``.
    """
    validate(dim[0], dim[1], num_boxes)
    for k in range(max_attempts):
        if k == 0:
            gen = rng if rng is not None else np.random.default_rng(seed)
        else:
            gen = np.random.default_rng(np.random.SeedSequence([seed, k]))
        try:
            return attempt(gen, dim, num_boxes, search_depth, max_states), k
        except GenerationFailed:
            continue
    raise RuntimeError(f"no {dim[0]}x{dim[1]} room with {num_boxes} boxes after "
                       f"{max_attempts} attempts (seed {seed})")
