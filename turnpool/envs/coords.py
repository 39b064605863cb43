"""RAGEN v2's coordinate observations (``observation_format``), shared by grid envs, and the
backtrack their shortest-path searches share.

``grid`` is the symbol grid alone; ``coord`` lists the board size and, per entity kind, its
zero-indexed ``(row, col)`` cells in row-major order (kinds without cells are left out);
``grid_coord`` gives both, coordinates first.

Example:
    >>> formatted("coord", "P_\\n_G", (2, 2), [("Player", [(0, 0)]), ("Holes", [])])
    'Board size: 2 rows x 2 cols (zero-indexed).\\nPlayer: (0, 0)'
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

import numpy as np

OBSERVATION_FORMATS = ("grid", "coord", "grid_coord")

Entities = Sequence[tuple[str, Sequence[tuple[int, int]]]]

Key = TypeVar("Key", bound=Hashable)


def check_format(observation_format: str) -> str:
    """``observation_format`` itself, or `ValueError` naming the ones there are."""
    if observation_format not in OBSERVATION_FORMATS:
        raise ValueError(f"observation_format must be one of {OBSERVATION_FORMATS}, "
                         f"got {observation_format!r}")
    return observation_format


def cells(mask: np.ndarray) -> list[tuple[int, int]]:
    """The ``(row, col)`` cells where a 2-d boolean mask is set, row-major."""
    return [(int(r), int(c)) for r, c in np.argwhere(mask)]


def coordinate_text(shape: tuple[int, int], entities: Entities) -> str:
    """The board size line, then one ``Label: (r, c), ...`` line per entity kind with cells."""
    rows, cols = shape
    lines = [f"Board size: {rows} rows x {cols} cols (zero-indexed)."]
    lines += [f"{label}: " + ", ".join(f"({r}, {c})" for r, c in where)
              for label, where in entities if where]
    return "\n".join(lines)


def formatted(observation_format: str, grid: str, shape: tuple[int, int],
              entities: Entities) -> str:
    """The observation text in ``observation_format`` (see the module docstring)."""
    if observation_format == "grid":
        return grid
    coords = coordinate_text(shape, entities)
    if observation_format == "coord":
        return coords
    return "Coordinates: \n" + coords + "\n" + "Grid Map: \n" + grid


def backtrack(parent: Mapping[Key, tuple[Key, int] | None], key: Key) -> list[int]:
    """The actions from a search's start to ``key``, given each reached key's ``(previous
    key, action)`` (``None`` at the start)."""
    actions = []
    step = parent[key]
    while step is not None:
        key, action = step
        actions.append(action)
        step = parent[key]
    return actions[::-1]
