"""Sokoban's text grid: cell codes and symbols, action names, reading a room back from an
observation text (`parse_observation`) and drawing a grid's ``rgb_array`` frame from tiles
(`frame_from_obs`). The env (`turnpool.envs.sokoban`) writes the grid; the solver and the
frame builders read it, from the text alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import numpy as np

from turnpool.envs.sokoban_gen import Room

ACTIONS: dict[int, str] = {1: "Up", 2: "Down", 3: "Left", 4: "Right"}
#: RAGEN's cell codes -> symbols (code 6, player on target, exists only in the rendering).
GRID_LOOKUP: dict[int, str] = {0: "#", 1: "_", 2: "O", 3: "√", 4: "X", 5: "P", 6: "S"}
WALL, FLOOR, TARGET, BOX_ON_TARGET, BOX, PLAYER, PLAYER_ON_TARGET = range(7)

#: Bounds on the observation text `parse_observation` reads (it may be hostile text).
MAX_OBS_CHARS = 10_000
MAX_CELLS = 1_024
#: A cell's side in a frame, in pixels.
TILE = 16


# ------------------------------------------------------------------------------ config
def grid_symbols(grid_lookup: Mapping[Any, Any] | None) -> tuple[str, ...]:
    """The 7 symbols (by code) from a ``grid_lookup`` mapping; YAML/JSON may give str keys."""
    table = dict(GRID_LOOKUP)
    for code, symbol in (grid_lookup or {}).items():
        code = int(code)
        if code not in table or not isinstance(symbol, str) or len(symbol) != 1:
            raise ValueError(f"grid_lookup maps codes 0-6 to single characters, got "
                             f"{code!r}: {symbol!r}")
        table[code] = symbol
    symbols = tuple(table[c] for c in range(7))
    if len(set(symbols)) != 7 or "\n" in symbols:
        raise ValueError(f"grid_lookup symbols must be 7 distinct characters, got {symbols}")
    return symbols


def action_names(action_lookup: Mapping[Any, Any] | None) -> dict[int, str]:
    """Action id (1-4) -> name, from an ``action_lookup`` mapping or the defaults."""
    if not action_lookup:
        return dict(ACTIONS)
    names = {int(k): str(v) for k, v in action_lookup.items()}
    if set(names) != set(ACTIONS):
        raise ValueError(f"sokoban action_lookup needs ids 1-4 (Up, Down, Left, Right), got "
                         f"{sorted(names)}")
    return names


# ------------------------------------------------------------------------------- tiles
#: gym_sokoban's tile files, by cell code (RAGEN's frames are drawn from them).
_GYM_TILES = ("wall", "floor", "box_target", "box_on_target", "box", "player",
              "player_on_target")


@lru_cache(maxsize=1)
def tiles() -> np.ndarray:
    """``(7, TILE, TILE, 3)`` uint8 images, one per cell code, loaded once per process.

    gym_sokoban's own tiles when it is installed (read from its package files without
    importing it), so frames are pixel-identical to RAGEN's; otherwise tiles drawn in code.
    """
    found = _gym_sokoban_tiles()
    return found if found is not None else _drawn_tiles()


def _gym_sokoban_tiles() -> np.ndarray | None:
    import importlib.util
    from pathlib import Path

    try:
        spec = importlib.util.find_spec("gym_sokoban")
        import imageio.v2 as imageio
    except ImportError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    surface = Path(next(iter(spec.submodule_search_locations))) / "envs" / "surface"
    try:
        images = [np.asarray(imageio.imread(surface / f"{name}.png"))[..., :3]
                  for name in _GYM_TILES]
    except OSError:
        return None
    if any(im.shape != (TILE, TILE, 3) for im in images):
        return None
    out = np.ascontiguousarray(np.stack(images).astype(np.uint8))
    out.setflags(write=False)
    return out


def _drawn_tiles() -> np.ndarray:
    """Tiles drawn in code (no gym_sokoban): same size and layout, other pixels."""
    y, x = np.mgrid[0:TILE, 0:TILE]
    centre = (TILE - 1) / 2
    square = np.maximum(np.abs(x - centre), np.abs(y - centre))
    disc = (x - centre) ** 2 + (y - centre) ** 2

    def filled(rgb: tuple[int, int, int]) -> np.ndarray:
        tile = np.empty((TILE, TILE, 3), dtype=np.uint8)
        tile[:] = rgb
        return tile

    floor = filled((48, 48, 56))
    floor[(x == 0) | (y == 0)] = (58, 58, 68)
    wall = filled((156, 74, 44))
    half = TILE // 2
    mortar = (y % half == 0) | ((x % TILE == 0) & (y < half)) | ((x == half) & (y > half))
    wall[mortar] = (96, 92, 88)
    target = floor.copy()
    target[(square >= 3.5) & (square <= 5.5)] = (214, 64, 64)

    def with_box(under: np.ndarray, rgb: tuple[int, int, int]) -> np.ndarray:
        tile = under.copy()
        body = square <= 6.5
        tile[body] = rgb
        tile[body & ((square >= 5.5) | (np.abs(x - y) <= 0.5) | (np.abs(x + y - 2 * centre)
                                                                   <= 0.5))] = (92, 60, 28)
        return tile

    def with_player(under: np.ndarray) -> np.ndarray:
        tile = under.copy()
        tile[disc <= 5.2**2] = (64, 128, 232)
        tile[disc <= 2.0**2] = (236, 236, 240)
        return tile

    out = np.stack([wall, floor, target, with_box(target, (88, 176, 88)),
                    with_box(floor, (194, 142, 64)), with_player(floor), with_player(target)])
    out.setflags(write=False)
    return out


# ------------------------------------------------------------------------------ frames
def frame_from_obs(obs: str, env_config: Mapping[str, Any] | None = None) -> np.ndarray:
    """The ``rgb_array`` frame of an observation text: the text names every cell, so the
    frame a worker would draw is drawn here from the text alone (no pixels cross processes).
    Frames are cached by text (group members and unchanged rooms share one); read-only.
    """
    return _frame(obs, grid_symbols((env_config or {}).get("grid_lookup")))


@lru_cache(maxsize=4096)
def _frame(obs: str, symbols: tuple[str, ...]) -> np.ndarray:
    code_of = {sym: code for code, sym in enumerate(symbols)}
    rows = obs.split("\n")
    if len(obs) > MAX_OBS_CHARS or len({len(r) for r in rows}) != 1:
        raise ValueError("not a rectangular Sokoban grid")
    codes = np.array([[code_of[ch] for ch in row] for row in rows], dtype=np.intp)
    h, w = codes.shape
    frame = np.ascontiguousarray(
        tiles()[codes].transpose(0, 2, 1, 3, 4).reshape(h * TILE, w * TILE, 3))
    frame.setflags(write=False)
    return frame


# ------------------------------------------------------------------------------ solver
def parse_observation(obs: str, grid_lookup: Mapping[Any, Any] | None = None) -> Room | None:
    """The room drawn in an observation text, or None if it is not a Sokoban grid.

    The grid need not have a wall border (cells outside it count as walls). Box and target
    counts must match and there must be exactly one player.
    """
    if not isinstance(obs, str) or len(obs) > MAX_OBS_CHARS:
        return None
    try:
        symbols = grid_symbols(grid_lookup)
    except (TypeError, ValueError):
        return None
    rows = obs.strip("\r\n").replace("\r\n", "\n").split("\n")
    height, width = len(rows), len(rows[0])
    if width == 0 or height * width > MAX_CELLS or any(len(r) != width for r in rows):
        return None
    code_of = {s: c for c, s in enumerate(symbols)}
    walls = bytearray(height * width)
    targets, boxes, players = [], [], []
    for p, ch in enumerate("".join(rows)):
        code = code_of.get(ch)
        if code is None:
            return None
        if code == WALL:
            walls[p] = 1
        if code in (TARGET, BOX_ON_TARGET, PLAYER_ON_TARGET):
            targets.append(p)
        if code in (BOX, BOX_ON_TARGET):
            boxes.append(p)
        if code in (PLAYER, PLAYER_ON_TARGET):
            players.append(p)
    if len(players) != 1 or not boxes or len(boxes) != len(targets):
        return None
    return Room(height, width, bytes(walls), tuple(targets), tuple(boxes), players[0])
