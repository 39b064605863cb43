"""Sokoban's solver: a shortest action sequence for a room (`solve_room`), by breadth-first
search over the player's cell and the boxes' cells (one bit per cell), pruning boxes pushed
where no target can be reached. Bounded by ``max_nodes`` states, since rooms may come from
hostile observation text. `turnpool.envs.sokoban.solve` and `oracle` are its faces.
"""

from __future__ import annotations

from collections.abc import Sequence

from turnpool.envs.coords import backtrack
from turnpool.envs.sokoban_gen import Room

#: States `solve_room` explores at most.
MAX_NODES = 200_000


def cells_of(mask: int) -> list[int]:
    """The cells whose bit is set in ``mask``, lowest first."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def mask_of(cells: Sequence[int]) -> int:
    """One bit per cell: the set of ``cells`` as an int."""
    mask = 0
    for p in cells:
        mask |= 1 << p
    return mask


def walled_in(room: Room) -> Room:
    """The room inside a one-cell wall frame, so every neighbour index is valid."""
    h, w = room.height + 2, room.width + 2

    def at(p: int) -> int:
        return p + w + 1 + 2 * (p // room.width)

    walls = bytearray(b"\x01") * (h * w)
    for p, is_wall in enumerate(room.walls):
        walls[at(p)] = is_wall
    return Room(h, w, bytes(walls), tuple(at(p) for p in room.targets),
                tuple(at(p) for p in room.boxes), at(room.player))


def _live_cells(room: Room) -> bytearray:
    """Cells from which a lone box can still be pushed onto some target."""
    live = bytearray(room.height * room.width)
    walls = room.walls
    todo = list(room.targets)
    for t in todo:
        live[t] = 1
    while todo:
        x = todo.pop()
        for d in room.deltas():
            y = x - d  # the box came from y, pushed by a player standing at y - d
            if not walls[y] and not live[y] and not walls[y - d]:
                live[y] = 1
                todo.append(y)
    return live


def solve_room(room: Room, max_nodes: int = MAX_NODES) -> list[int] | None:
    """A shortest action sequence (ids 1-4) that puts every box on a target.

    ``[]`` when the room is already solved, None when it is unsolvable or the search would
    exceed ``max_nodes`` states.
    """
    if len(room.boxes) != len(room.targets) or room.player in room.boxes:
        return None
    room = walled_in(room)
    walls, target_mask = room.walls, mask_of(room.targets)
    start_boxes = mask_of(room.boxes)
    if start_boxes == target_mask:
        return []
    live = _live_cells(room)
    if any(not live[b] for b in room.boxes):
        return None
    shift = (room.height * room.width).bit_length()
    low = (1 << shift) - 1
    moves = tuple(zip((1, 2, 3, 4), room.deltas()))
    start = start_boxes << shift | room.player
    parent: dict[int, tuple[int, int] | None] = {start: None}
    frontier = [start]
    while frontier:
        following: list[int] = []
        for key in frontier:
            p, mask = key & low, key >> shift
            for action, d in moves:
                q = p + d
                if walls[q]:
                    continue
                if mask >> q & 1:
                    b = q + d
                    if walls[b] or mask >> b & 1 or not live[b]:
                        continue
                    new_mask = mask ^ (1 << q) ^ (1 << b)
                    new_key = new_mask << shift | q
                    if new_key in parent:
                        continue
                    parent[new_key] = (key, action)
                    if new_mask == target_mask:
                        return backtrack(parent, new_key)
                else:
                    new_key = mask << shift | q
                    if new_key in parent:
                        continue
                    parent[new_key] = (key, action)
                following.append(new_key)
            if len(parent) > max_nodes:
                return None
        frontier = following
    return None

