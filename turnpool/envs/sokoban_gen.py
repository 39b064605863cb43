"""Sokoban room generation by reverse play: RAGEN's rooms, from local generators, fast.

RAGEN (its copy of gym_sokoban's generator) builds a room in four stages; this module makes
the same draws in the same order, so a seed gives RAGEN's room, but each env owns its
generators: a ``random.Random(seed)`` where RAGEN seeded Python's global ``random``, and a
``numpy.random.RandomState(seed)`` where it seeded numpy's legacy global RNG.

1. *topology* (``random``): a direction and a start cell, then a walk of
   ``int(1.7 * (h + w))`` steps that turns with probability 0.35 and stamps one of five small
   floor masks at each step; the border is wall;
2. *placement* (numpy): the player, then ``num_boxes`` targets, on random floor cells
   (row-major order, as ``np.where`` lists them);
3. *reverse play*: from every box on its target, a depth-first search over "pull" moves (the
   player steps away from an adjacent box and drags it along), first-visit deduplication of
   states, depth ``search_depth - 2`` at most; the first state with the best score
   (box swaps x total box-target distance, 0 while a box or the player is on a target)
   becomes the room. Up to 4 tries of stages 1-3; a score of 0 after them (or too little floor)
   fails the attempt;
4. *jitter* (``random``): the player walks up to three random steps onto free, unvisited cells
   (probability 0.8 when the total displacement is 1, else 0.5; it continues with 0.5).

Every pull is a push played backwards, so every room is solvable by construction.

A failed attempt is retried, as RAGEN does, with the seed ``abs(hash(str(seed))) % 2**32``.
Python salts ``hash(str)`` per process, so RAGEN itself is reproducible only with a pinned
``PYTHONHASHSEED`` (its scripts export 10000). The rule here: the retry seed is the value
CPython (3.11 or later, SipHash-1-3) computes under ``PYTHONHASHSEED=hash_seed`` (default
10000), computed by :func:`ragen_retry_seed` without touching ``hash()``, so every process
agrees and matches RAGEN run as its scripts run it.

Why this is much faster than the original: the search state is ``(player cell, bitmask of box
cells, bitmask of boxes moved so far)`` over a fixed wall/target layout, moves come from a
precomputed neighbour table and the score is updated incrementally; the original copies and
serializes the whole grid at every state.

Example:
    >>> room, failures = generate(10000, (6, 6), num_boxes=1)
    >>> len(room.boxes), room.player not in room.boxes
    (1, True)
"""

from __future__ import annotations

import random
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
#: Topology + placement + reverse play tries inside one attempt (RAGEN's ``tries``).
TRIES = 4
#: Reverse play stops after exploring this many distinct states (a bound on work).
MAX_STATES = 300_000
#: Attempts (each with a new retry seed) before ``generate`` gives up.
MAX_ATTEMPTS = 1_000
#: The ``PYTHONHASHSEED`` whose ``hash(str(seed))`` RAGEN's retry seeds follow (its scripts').
RAGEN_HASH_SEED = 10_000


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


# ------------------------------------------------------------------------ retry seeds
_MASK64 = (1 << 64) - 1


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & _MASK64


def _siphash13(k0: int, k1: int, data: bytes) -> int:
    v0, v1 = k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D
    v2, v3 = k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573

    def rounds(n: int) -> None:
        nonlocal v0, v1, v2, v3
        for _ in range(n):
            v0 = (v0 + v1) & _MASK64
            v1 = _rotl(v1, 13) ^ v0
            v0 = _rotl(v0, 32)
            v2 = (v2 + v3) & _MASK64
            v3 = _rotl(v3, 16) ^ v2
            v0 = (v0 + v3) & _MASK64
            v3 = _rotl(v3, 21) ^ v0
            v2 = (v2 + v1) & _MASK64
            v1 = _rotl(v1, 17) ^ v2
            v2 = _rotl(v2, 32)

    tail = len(data) % 8
    for i in range(0, len(data) - tail, 8):
        m = int.from_bytes(data[i:i + 8], "little")
        v3 ^= m
        rounds(1)
        v0 ^= m
    b = ((len(data) & 0xFF) << 56) | int.from_bytes(data[len(data) - tail:], "little")
    v3 ^= b
    rounds(1)
    v0 ^= b
    v2 ^= 0xFF
    rounds(3)
    return v0 ^ v1 ^ v2 ^ v3


@lru_cache(maxsize=8)
def _hash_key(hash_seed: int) -> tuple[int, int]:
    """CPython's SipHash key for ``PYTHONHASHSEED=hash_seed`` (its LCG fill of the secret)."""
    if hash_seed == 0:
        return 0, 0
    x, out = hash_seed, bytearray(16)
    for i in range(16):
        x = (x * 214013 + 2531011) & 0xFFFFFFFF
        out[i] = (x >> 16) & 0xFF
    return int.from_bytes(out[:8], "little"), int.from_bytes(out[8:], "little")


def str_hash(text: str, hash_seed: int = RAGEN_HASH_SEED) -> int:
    """``hash(text)`` of CPython >= 3.11 run with ``PYTHONHASHSEED=hash_seed`` (ASCII text)."""
    data = text.encode("ascii")
    if not data:
        return 0
    value = _siphash13(*_hash_key(hash_seed), data)
    if value >= 1 << 63:
        value -= 1 << 64
    return -2 if value == -1 else value


def ragen_retry_seed(seed: int, hash_seed: int = RAGEN_HASH_SEED) -> int:
    """The seed RAGEN retries a failed generation with: ``abs(hash(str(seed))) % 2**32``."""
    return abs(str_hash(str(seed), hash_seed)) % 2**32


# ----------------------------------------------------------------------------- stages
def topology(py: random.Random, height: int, width: int, steps: int) -> bytearray:
    """Floor flags (1 floor, 0 wall) from a random walk; the border stays wall."""
    choice, uniform = py.choice, py.random
    dr, dc = choice(_WALK_DIRECTIONS)
    r, c = py.randint(1, height - 1), py.randint(1, width - 1)
    floor = bytearray(height * width)
    for _ in range(steps):
        if uniform() < P_CHANGE_DIRECTION:
            dr, dc = choice(_WALK_DIRECTIONS)
        r = min(max(r + dr, 1), height - 2)
        c = min(max(c + dc, 1), width - 2)
        for mr, mc in choice(_MASKS):
            floor[(r + mr) * width + c + mc] = 1
    for col in range(width):
        floor[col] = floor[(height - 1) * width + col] = 0
    for row in range(height):
        floor[row * width] = floor[row * width + width - 1] = 0
    return floor


def place(rs: np.random.RandomState, floor: bytearray, num_boxes: int
          ) -> tuple[int, tuple[int, ...]]:
    """``(player, targets)``: the player, then each target, on a random free floor cell."""
    cells = [p for p, f in enumerate(floor) if f]
    if len(cells) <= num_boxes + 1:
        raise GenerationFailed(f"{len(cells)} floor cells for {num_boxes} boxes and a player")
    player = cells.pop(int(rs.randint(len(cells))))
    # ``cells`` stays in row-major order, which is how RAGEN lists the free cells
    targets = [cells.pop(int(rs.randint(len(cells)))) for _ in range(num_boxes)]
    return player, tuple(sorted(targets))


@lru_cache(maxsize=64)
def _coords(height: int, width: int) -> tuple[tuple[int, int], ...]:
    return tuple(divmod(p, width) for p in range(height * width))


def reverse_play(height: int, width: int, walls: bytes, targets: tuple[int, ...], player: int,
                 search_depth: int, max_states: int = MAX_STATES
                 ) -> tuple[int, int, tuple[int, ...]]:
    """Pull boxes off their targets; ``(best score, player, box cells by target)``.

    Depth-first over pull moves in the order Up, Down, Left, Right; a state is expanded the
    first time it is reached, when it is at most ``search_depth - 2`` moves deep (RAGEN's
    ``ttl`` counting); at most ``max_states`` states in all. A state is the player cell, the
    box cells and which boxes have moved (RAGEN's grid tells moved boxes apart).
    """
    n_cells = height * width
    deltas = (-width, width, -1, 1)
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
    max_depth = search_depth - 2

    best_score, best_player, best_boxes = 0, player, targets
    if max_depth < 0:
        return best_score, best_player, best_boxes
    seen: set[int] = set()
    # (player, boxes by target index, box mask, moved mask, last pulled, swaps, dist, depth)
    stack: list[tuple[int, tuple[int, ...], int, int, int, int, int, int]] = [
        (player, targets, target_mask, 0, -1, 0, 0, 0)]
    pop, push, mark = stack.pop, stack.append, seen.add
    while stack:
        p, boxes, mask, moved, last, swaps, total, depth = pop()
        key = (((moved << n_cells) | mask) << shift) | p
        if key in seen:
            continue
        if len(seen) >= max_states:
            break
        mark(key)
        if not (mask | (1 << p)) & target_mask:
            score = swaps * total
            if score > best_score:
                best_score, best_player, best_boxes = score, p, boxes
        if depth >= max_depth:
            continue
        depth += 1
        # reversed, so the first direction is explored first (as a recursive search would)
        for q, behind in reversed(moves[p]):
            if mask >> q & 1:
                continue
            if mask >> behind & 1:
                i = boxes.index(behind)
                push((q, boxes[:i] + (p,) + boxes[i + 1:], mask ^ (1 << behind) ^ (1 << p),
                      moved | (1 << i), i, swaps + (i != last),
                      total + dist[i][p] - dist[i][behind], depth))
            else:
                push((q, boxes, mask, moved, last, swaps, total, depth))
    return best_score, best_player, best_boxes


def jitter(py: random.Random, width: int, walls: bytes, boxes: tuple[int, ...], player: int,
           displacement: int) -> int:
    """Up to three random steps onto free, not yet visited cells; the new player cell."""
    if py.random() > (0.8 if displacement == 1 else 0.5):
        return player
    visited = [player]
    for step in range(1, 4):
        options = [q for q in (player - width, player + width, player - 1, player + 1)
                   if not walls[q] and q not in boxes and q not in visited]
        if not options:
            break
        player = py.choice(options)
        visited.append(player)
        if step >= 3 or py.random() > 0.5:
            break
    return player


# ----------------------------------------------------------------------------- driver
def attempt(seed: int, dim: tuple[int, int], num_boxes: int, search_depth: int,
            max_states: int = MAX_STATES) -> Room:
    """RAGEN's ``generate_room`` under ``seed``; raises `GenerationFailed` when it yields none."""
    height, width = dim
    py = random.Random(seed)
    rs = np.random.RandomState(seed % 2**32)
    steps = num_gen_steps(height, width)
    for _ in range(TRIES):
        floor = topology(py, height, width, steps)
        player, targets = place(rs, floor, num_boxes)
        walls = bytes(1 - f for f in floor)
        score, player, boxes = reverse_play(height, width, walls, targets, player,
                                            search_depth, max_states)
        if score > 0:
            break
    else:
        raise GenerationFailed("reverse play could not move every box off its target")
    displacement = sum(abs(b // width - t // width) + abs(b % width - t % width)
                       for b, t in zip(boxes, targets))
    player = jitter(py, width, walls, boxes, player, displacement)
    return Room(height, width, walls, targets, tuple(sorted(boxes)), player)


def generate(seed: int, dim: tuple[int, int], num_boxes: int = 1, search_depth: int = 300,
             max_attempts: int = MAX_ATTEMPTS, max_states: int = MAX_STATES,
             hash_seed: int = RAGEN_HASH_SEED) -> tuple[Room, int]:
    """RAGEN's room for ``seed``; ``(room, failed attempts)``.

    A failed attempt moves to ``ragen_retry_seed(seed, hash_seed)``, as RAGEN's reset does.
    """
    validate(dim[0], dim[1], num_boxes)
    current = int(seed)
    for k in range(max_attempts):
        try:
            return attempt(current, dim, num_boxes, search_depth, max_states), k
        except GenerationFailed:
            current = ragen_retry_seed(current, hash_seed)
    raise RuntimeError(f"no {dim[0]}x{dim[1]} room with {num_boxes} boxes after "
                       f"{max_attempts} attempts (seed {seed})")
