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

:func:`solve` (breadth-first search over player and box cells,
:mod:`turnpool.envs.sokoban_solver`) finds a shortest action sequence for an env or an
observation; :func:`oracle` returns it as action names. The text grid's symbols, parsing and
frames live in :mod:`turnpool.envs.sokoban_grid`.

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
from turnpool.envs.sokoban_grid import (
    ACTIONS,
    BOX,
    BOX_ON_TARGET,
    FLOOR,
    GRID_LOOKUP,
    MAX_CELLS,
    MAX_OBS_CHARS,
    PLAYER,
    PLAYER_ON_TARGET,
    TARGET,
    TILE,
    WALL,
    action_names,
    frame_from_obs,
    grid_symbols,
    parse_observation,
    tiles,
)
from turnpool.envs.sokoban_solver import MAX_NODES, cells_of, mask_of, solve_room, walled_in

#: RAGEN v2's coordinate lines after "Targets" (which lists boxed and stood-on ones too)
_COORD_ENTITIES = (("Boxes", BOX), ("Boxes on target", BOX_ON_TARGET),
                   ("Player", PLAYER), ("Player on target", PLAYER_ON_TARGET))
STEP_REWARD = -0.1
BOX_ON_REWARD = 1.0
BOX_OFF_REWARD = -1.0
SOLVED_REWARD = 10.0


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
        cells = cells_of(boxes)
        on = [p for p in cells if self.target_mask >> p & 1]
        grid[[p for p in cells if p not in on]] = BOX
        grid[on] = BOX_ON_TARGET
        grid[player] = PLAYER_ON_TARGET if self.target_mask >> player & 1 else PLAYER
        return grid.reshape(room.height, room.width)


@lru_cache(maxsize=4096)
def _generated(seed: int, dim: tuple[int, int], num_boxes: int, search_depth: int
               ) -> tuple[Room, int]:
    """`generate`'s room for ``seed``, kept per process: a `Room` is immutable and a pure
    function of its arguments, and generating one is ~90% of a reset (~0.2 ms), while the
    same seeds come back often (a GRPO group's members, a served session that resets to its
    seed, evaluation seeds)."""
    return generate(seed, dim, num_boxes, search_depth)


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
        self._symbols = grid_symbols(grid_lookup)
        self._names = action_names(action_lookup)
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
            room = walled_in(room)
        self.seed = None
        self.generation_failures = 0
        obs = self._start(room)
        return obs, self._info({"success": self._terminated, "action_is_valid": True,
                                "action_is_effective": False})

    def _start(self, room: Room) -> str:
        self._board = _Board.build(room, self._symbols)
        self._player = room.player
        self._boxes = mask_of(room.boxes)
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
        return Room(r.height, r.width, r.walls, r.targets, tuple(cells_of(self._boxes)),
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


def _walled(room: Room) -> bool:
    """Whether every border cell is a wall (the env's moves never leave the grid then)."""
    h, w, walls = room.height, room.width, room.walls
    return all(walls[c] and walls[(h - 1) * w + c] for c in range(w)) and all(
        walls[r * w] and walls[r * w + w - 1] for r in range(h))


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
        names = action_names(config.get("action_lookup"))
    except (TypeError, ValueError):
        return []
    return [names[a] for a in solve(obs, config.get("grid_lookup"))]


SokobanEnv.oracle = staticmethod(oracle)
SokobanEnv.frame_from_obs = staticmethod(frame_from_obs)


__all__ = ["ACTIONS", "BOX_OFF_REWARD", "BOX_ON_REWARD", "GRID_LOOKUP", "MAX_CELLS", "MAX_NODES",
           "MAX_OBS_CHARS", "SOLVED_REWARD", "STEP_REWARD", "SokobanEnv", "frame_from_obs",
           "oracle", "parse_observation", "solve", "solve_room", "tiles"]
