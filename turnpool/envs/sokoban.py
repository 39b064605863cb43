"""Sokoban: push every box onto a target. RAGEN-compatible text env with a fast generator.

Semantics (RAGEN / gym_sokoban, written from scratch):

* rooms come from :mod:`turnpool.envs.sokoban_gen` (random-walk topology, reverse play,
  player jitter); every room is solvable, and a seed names one room in every process;
* observation: grid rows joined by ``"\\n"``: ``#`` wall, ``_`` floor, ``O`` target, ``X`` box,
  ``√`` box on target, ``P`` player, ``S`` player on target (``grid_lookup`` renames them, using
  RAGEN's codes 0 wall ... 6 player on target);
* actions 1 Up, 2 Down, 3 Left, 4 Right: move, pushing a box when one is in the way and the
  cell behind it is free (else the player stays put);
* reward -0.1 per step, +1 when a box lands on a target, -1 when one leaves it, +10 when all
  boxes are on targets (so the solving push of a one-box room returns 10.9);
* all boxes on targets -> ``terminated``; ``max_steps`` steps -> ``truncated``;
* ``info``: ``success`` (all boxes on targets), ``action_is_valid``, ``action_is_effective``
  (the player moved).

Choices where RAGEN is silent or we differ on purpose:

* an invalid action (not 1-4 nor one of the action names) changes nothing: reward 0, the step
  does not count towards ``max_steps``, ``action_is_valid=False``;
* stepping an episode that has ended steps on, as gym_sokoban's env does (RAGEN steps
  finished envs): a solved room still pays the +10 of "all boxes on targets";
* the observation is always text; ``render("rgb_array")`` draws the room from tiles built in
  code (``render_mode`` is accepted for RAGEN configs);
* ``get_state`` / ``set_state`` copy a few integers and share the immutable room, so a group's
  room is generated once and copied to its members;
* each process keeps the last 4,096 rooms it generated (and their boards), by seed and
  settings: a reset to a seed seen before costs ~11 µs instead of ~230 (a served session
  resetting to its seed, a GRPO group, evaluation seeds).

:func:`solve` (breadth-first search over player and box cells) finds a shortest action
sequence for an env or an observation; :func:`oracle` returns it as action names.

Example:
    >>> env = SokobanEnv(dim_room=(6, 6), num_boxes=1)
    >>> obs, info = env.reset(seed=123)
    >>> total = 0.0
    >>> for name in oracle(obs, {}):
    ...     obs, reward, terminated, truncated, info = env.step(name)
    ...     total += reward
    >>> info["success"], terminated
    (True, True)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from turnpool.envs.base import TextEnv
from turnpool.envs.coords import cells, check_format, formatted
from turnpool.envs.sokoban_gen import Room, generate, validate

ACTIONS: dict[int, str] = {1: "Up", 2: "Down", 3: "Left", 4: "Right"}
#: RAGEN's cell codes -> symbols (code 6, player on target, exists only in the rendering).
GRID_LOOKUP: dict[int, str] = {0: "#", 1: "_", 2: "O", 3: "√", 4: "X", 5: "P", 6: "S"}
WALL, FLOOR, TARGET, BOX_ON_TARGET, BOX, PLAYER, PLAYER_ON_TARGET = range(7)

#: RAGEN v2's coordinate lines after "Targets" (which lists boxed and stood-on ones too)
_COORD_ENTITIES = (("Boxes", BOX), ("Boxes on target", BOX_ON_TARGET),
                   ("Player", PLAYER), ("Player on target", PLAYER_ON_TARGET))
STEP_REWARD = -0.1
BOX_ON_REWARD = 1.0
BOX_OFF_REWARD = -1.0
SOLVED_REWARD = 10.0

#: Bounds on what `solve` accepts and explores (observations may be hostile text).
MAX_OBS_CHARS = 10_000
MAX_CELLS = 1_024
MAX_NODES = 200_000
TILE = 16


# ------------------------------------------------------------------------------ config
def _symbols(grid_lookup: Mapping[Any, Any] | None) -> tuple[str, ...]:
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


def _action_names(action_lookup: Mapping[Any, Any] | None) -> dict[int, str]:
    if not action_lookup:
        return dict(ACTIONS)
    names = {int(k): str(v) for k, v in action_lookup.items()}
    if set(names) != set(ACTIONS):
        raise ValueError(f"sokoban action_lookup needs ids 1-4 (Up, Down, Left, Right), got "
                         f"{sorted(names)}")
    return names


# ------------------------------------------------------------------------------- board
@dataclass(frozen=True)
class _Board:
    """The fixed part of a room as the env uses it (shared between copies of one episode)."""

    room: Room
    symbols: tuple[str, ...]
    target_mask: int
    deltas: tuple[int, int, int, int]
    #: the text with every box and the player removed, as a list of characters
    base: tuple[str, ...]
    #: cell -> position of its character in the text
    char_at: tuple[int, ...]

    @classmethod
    @lru_cache(maxsize=4096)
    def build(cls, room: Room, symbols: tuple[str, ...]) -> _Board:
        """The board of ``room`` drawn with ``symbols``; kept per process, as the rooms of
        `_generated` are (both are immutable)."""
        w = room.width
        targets = set(room.targets)
        base: list[str] = []
        for p in range(room.height * w):
            if p and p % w == 0:
                base.append("\n")
            base.append(symbols[WALL if room.walls[p] else TARGET if p in targets else FLOOR])
        mask = 0
        for t in targets:
            mask |= 1 << t
        return cls(room, symbols, mask, room.deltas(), tuple(base),
                   tuple(p + p // w for p in range(room.height * w)))

    def render(self, player: int, boxes: int) -> str:
        chars = list(self.base)
        symbols, char_at, targets = self.symbols, self.char_at, self.target_mask
        while boxes:
            low = boxes & -boxes
            p = low.bit_length() - 1
            chars[char_at[p]] = symbols[BOX_ON_TARGET if targets & low else BOX]
            boxes ^= low
        chars[char_at[player]] = symbols[PLAYER_ON_TARGET if targets >> player & 1 else PLAYER]
        return "".join(chars)

    def codes(self, player: int, boxes: int) -> np.ndarray:
        """RAGEN cell codes (0-6) as a ``(height, width)`` array."""
        room = self.room
        grid = np.where(np.frombuffer(room.walls, dtype=np.uint8) == 1, WALL, FLOOR)
        grid[list(room.targets)] = TARGET
        cells = _cells(boxes)
        on = [p for p in cells if self.target_mask >> p & 1]
        grid[[p for p in cells if p not in on]] = BOX
        grid[on] = BOX_ON_TARGET
        grid[player] = PLAYER_ON_TARGET if self.target_mask >> player & 1 else PLAYER
        return grid.reshape(room.height, room.width)


def _cells(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def _mask(cells: Sequence[int]) -> int:
    mask = 0
    for p in cells:
        mask |= 1 << p
    return mask


@lru_cache(maxsize=4096)
def _generated(seed: int, dim: tuple[int, int], num_boxes: int, search_depth: int
               ) -> tuple[Room, int]:
    """`generate`'s room for ``seed``, kept per process: a `Room` is immutable and a pure
    function of its arguments, and generating one is ~90% of a reset (~0.2 ms), while the
    same seeds come back often (a GRPO group's members, a served session that resets to its
    seed, evaluation seeds)."""
    return generate(seed, dim, num_boxes, search_depth)


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


# --------------------------------------------------------------------------------- env
class SokobanEnv(TextEnv):
    """Sokoban on a generated room; see the module docstring for the rules."""

    action_kind = "discrete"
    action_lookup = dict(ACTIONS)
    grid_lookup = dict(GRID_LOOKUP)
    grid_vocab = {"#": "wall", "_": "empty", "O": "target", "√": "box on target", "X": "box",
                  "P": "player", "S": "player on target"}
    instruction = (
        "Sokoban: you are the player P. Push every box X onto a target O. Walking into a box "
        "pushes it one cell if the cell behind it is free; boxes cannot be pulled or pushed "
        "into walls or other boxes. Answer with a sequence of moves, for example "
        "<answer>Right || Right || Up</answer>")
    metadata = {"render_modes": ["text", "rgb_array"], "render_fps": 1}
    #: what RAGEN's env reports in ``info`` (the RAGEN facade shows only these)
    ragen_info_keys = ("action_is_effective", "action_is_valid", "success")

    def __init__(self, dim_room: Sequence[int] = (6, 6), num_boxes: int = 1,
                 max_steps: int = 100, search_depth: int = 300,
                 render_mode: str | None = "text",
                 dim_x: int | None = None, dim_y: int | None = None,
                 grid_lookup: Mapping[Any, Any] | None = None,
                 grid_vocab: Mapping[str, str] | None = None,
                 action_lookup: Mapping[Any, Any] | None = None,
                 observation_format: str = "grid") -> None:
        height, width = (int(v) for v in dim_room)
        height = height if dim_x is None else int(dim_x)
        width = width if dim_y is None else int(dim_y)
        validate(height, width, int(num_boxes))
        if render_mode not in (None, *self.metadata["render_modes"]):  # None: gymnasium's
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}")
        if int(max_steps) < 1 or int(search_depth) < 1:
            raise ValueError("max_steps and search_depth must be >= 1")
        super().__init__(dim_room=(height, width), num_boxes=int(num_boxes),
                         max_steps=int(max_steps), search_depth=int(search_depth),
                         render_mode=render_mode)
        self.dim_room = (height, width)
        self.num_boxes = int(num_boxes)
        self.max_steps = int(max_steps)
        self.search_depth = int(search_depth)
        self.render_mode = render_mode
        self.observation_format = check_format(observation_format)  # RAGEN v2's CoordSokoban
        del grid_vocab  # accepted for RAGEN configs; it only shapes the prompt (managers)
        self._symbols = _symbols(grid_lookup)
        self._names = _action_names(action_lookup)
        self._ids = {name.lower(): aid for aid, name in self._names.items()}
        self._board: _Board | None = None
        self._player = 0
        self._boxes = 0
        self._on_target = 0
        self._steps = 0
        self._terminated = False
        self._truncated = False
        self._obs = ""
        self.generation_failures = 0

    # ---------------------------------------------------------------- episode
    def _reset(self, seed: int, options: dict[str, Any]) -> str:
        room, self.generation_failures = _generated(seed, self.dim_room, self.num_boxes,
                                                    self.search_depth)
        return self._start(room)

    def load(self, room: Room | str) -> tuple[str, dict[str, Any]]:
        """Start an episode from a given room (a `Room` or an observation text).

        For hand-made puzzles and tests; the room may have any size and number of boxes.
        A text grid without a wall border gets one.
        """
        if isinstance(room, str):
            parsed = parse_observation(room, dict(enumerate(self._symbols)))
            if parsed is None:
                raise ValueError("not a Sokoban grid with one player and as many boxes as "
                                 "targets")
            room = parsed
        cells = {room.player, *room.boxes}
        if len(cells) != len(room.boxes) + 1 or len(set(room.targets)) != len(room.boxes) \
                or any(room.walls[p] for p in cells | set(room.targets)):
            raise ValueError("a room needs one player, distinct boxes as many as targets, "
                             "none of them on a wall")
        if not _walled(room):
            room = _pad(room)
        self.seed = None
        self.generation_failures = 0
        obs = self._start(room)
        return obs, self._info({"success": self._terminated, "action_is_valid": True,
                                "action_is_effective": False})

    def _start(self, room: Room) -> str:
        self._board = _Board.build(room, self._symbols)
        self._player = room.player
        self._boxes = _mask(room.boxes)
        self._on_target = (self._boxes & self._board.target_mask).bit_count()
        self._steps = 0
        self._terminated = self._boxes == self._board.target_mask
        self._truncated = False
        self._obs = self._board.render(self._player, self._boxes)
        return self._text()

    def parse_action(self, action: Any) -> int | None:
        """1-4, or an action name in any case; anything else is None (invalid)."""
        if isinstance(action, str):
            return self._ids.get(action.strip().lower())
        if isinstance(action, (int, np.integer)) and not isinstance(action, bool):
            return int(action) if 1 <= action <= 4 else None
        return None

    def _step(self, action: int | None) -> tuple[str, float, bool, bool, dict[str, Any]]:
        board = self._board
        if board is None:
            raise RuntimeError("call reset() before step()")
        solved = self._terminated
        if action is None:
            return self._text(), 0.0, self._terminated, self._truncated, {
                "success": solved, "action_is_valid": False, "action_is_effective": False}
        # A finished episode steps on as gym_sokoban's does (RAGEN steps finished envs).
        d = board.deltas[action - 1]
        walls = board.room.walls
        boxes = self._boxes
        q = self._player + d
        moved = False
        if not walls[q]:
            if boxes >> q & 1:
                b = q + d
                if not walls[b] and not boxes >> b & 1:
                    self._boxes = boxes ^ (1 << q) ^ (1 << b)
                    moved = True
            else:
                moved = True
        self._steps += 1
        reward = STEP_REWARD
        if moved:
            self._player = q
            on = (self._boxes & board.target_mask).bit_count()
            if on > self._on_target:
                reward += BOX_ON_REWARD
            elif on < self._on_target:
                reward += BOX_OFF_REWARD
            self._on_target = on
            self._obs = board.render(q, self._boxes)
        solved = self._boxes == board.target_mask
        if solved:  # every step of a solved room pays it, as in gym_sokoban
            reward += SOLVED_REWARD
        self._terminated = solved
        self._truncated = not solved and self._steps == self.max_steps  # gym_sokoban's test
        return self._text(), reward, self._terminated, self._truncated, {
            "success": solved, "action_is_valid": True, "action_is_effective": moved}

    def _render_text(self) -> str:
        return self._obs

    def _text(self) -> str:
        """The observation in ``observation_format`` (the grid, or RAGEN v2's coordinates)."""
        if self.observation_format == "grid" or self._board is None:
            return self._obs
        codes = self._board.codes(self._player, self._boxes)
        targets = np.isin(codes, (TARGET, BOX_ON_TARGET, PLAYER_ON_TARGET))
        entities = [("Targets", cells(targets))]
        entities += [(label, cells(codes == code)) for label, code in _COORD_ENTITIES]
        return formatted(self.observation_format, self._obs, self.dim_room, entities)

    def _render_rgb_array(self) -> np.ndarray:
        """The room as an ``(h*16, w*16, 3)`` image (``render("rgb_array")``)."""
        if self._board is None:
            raise RuntimeError("call reset() before render()")
        codes = self._board.codes(self._player, self._boxes)
        h, w = codes.shape
        return tiles()[codes].transpose(0, 2, 1, 3, 4).reshape(h * TILE, w * TILE, 3)

    # ---------------------------------------------------------------- inspection
    @property
    def room(self) -> Room:
        """The current room (fixed layout plus the player and box cells now)."""
        if self._board is None:
            raise RuntimeError("call reset() first")
        r = self._board.room
        return Room(r.height, r.width, r.walls, r.targets, tuple(_cells(self._boxes)),
                    self._player)

    @property
    def num_env_steps(self) -> int:
        """Valid steps taken in this episode."""
        return self._steps

    # ---------------------------------------------------------------- group copying
    def get_state(self) -> dict[str, Any]:
        """A small snapshot: the shared immutable board plus a few integers and the RNG."""
        return {"board": self._board, "player": self._player, "boxes": self._boxes,
                "on_target": self._on_target, "steps": self._steps,
                "terminated": self._terminated, "truncated": self._truncated,
                "obs": self._obs, "seed": self.seed,
                "generation_failures": self.generation_failures,
                "rng": self.np_random.bit_generator.state}

    def set_state(self, state: Any) -> None:
        """Restore a `get_state` snapshot (possibly from another env with the same config)."""
        board: _Board | None = state["board"]
        if board is not None and board.symbols != self._symbols:
            board = _Board.build(board.room, self._symbols)
        self._board = board
        self._player = int(state["player"])
        self._boxes = int(state["boxes"])
        self._on_target = int(state["on_target"])
        self._steps = int(state["steps"])
        self._terminated = bool(state["terminated"])
        self._truncated = bool(state["truncated"])
        self._obs = board.render(self._player, self._boxes) if board else str(state["obs"])
        self.seed = state["seed"]
        self.generation_failures = int(state["generation_failures"])
        self.np_random.bit_generator.state = state["rng"]


# ------------------------------------------------------------------------------ frames
def frame_from_obs(obs: str, env_config: Mapping[str, Any] | None = None) -> np.ndarray:
    """The ``rgb_array`` frame of an observation text: the text names every cell, so the
    frame a worker would draw is drawn here from the text alone (no pixels cross processes).
    Frames are cached by text (group members and unchanged rooms share one); read-only.
    """
    return _frame(obs, _symbols((env_config or {}).get("grid_lookup")))


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
        symbols = _symbols(grid_lookup)
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


def _pad(room: Room) -> Room:
    """The room inside a one-cell wall frame, so every neighbour index is valid."""
    h, w = room.height + 2, room.width + 2

    def at(p: int) -> int:
        return p + w + 1 + 2 * (p // room.width)

    walls = bytearray(b"\x01") * (h * w)
    for p, is_wall in enumerate(room.walls):
        walls[at(p)] = is_wall
    return Room(h, w, bytes(walls), tuple(at(p) for p in room.targets),
                tuple(at(p) for p in room.boxes), at(room.player))


def _walled(room: Room) -> bool:
    """Whether every border cell is a wall (the env's moves never leave the grid then)."""
    h, w, walls = room.height, room.width, room.walls
    return all(walls[c] and walls[(h - 1) * w + c] for c in range(w)) and all(
        walls[r * w] and walls[r * w + w - 1] for r in range(h))


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
    room = _pad(room)
    walls, target_mask = room.walls, _mask(room.targets)
    start_boxes = _mask(room.boxes)
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
                        return _path(parent, new_key)
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


def _path(parent: dict[int, tuple[int, int] | None], key: int) -> list[int]:
    actions = []
    step = parent[key]
    while step is not None:
        key, action = step
        actions.append(action)
        step = parent[key]
    return actions[::-1]


def solve(source: SokobanEnv | Room | str, grid_lookup: Mapping[Any, Any] | None = None,
          max_nodes: int = MAX_NODES) -> list[int]:
    """A shortest action sequence (ids 1-4) from an env's current state, a room or an
    observation text; ``[]`` when already solved, unsolvable, unparseable or too big."""
    if isinstance(source, SokobanEnv):
        room: Room | None = source.room
    elif isinstance(source, Room):
        room = source
    else:
        room = parse_observation(source, grid_lookup)
    if room is None:
        return []
    return solve_room(room, max_nodes) or []


def oracle(obs: str, env_config: Mapping[str, Any] | None = None) -> list[str]:
    """The remaining action names of a shortest solution, read from the observation text.

    ``env_config`` supplies ``grid_lookup`` / ``action_lookup`` when they differ from the
    defaults. ``[]`` when the text is not a solvable Sokoban grid.
    """
    config = env_config or {}
    try:
        names = _action_names(config.get("action_lookup"))
    except (TypeError, ValueError):
        return []
    return [names[a] for a in solve(obs, config.get("grid_lookup"))]


SokobanEnv.oracle = staticmethod(oracle)
SokobanEnv.frame_from_obs = staticmethod(frame_from_obs)
