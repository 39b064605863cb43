"""Trajectories as Python objects and as JSONL (one trajectory per line).

The JSONL form is canonical (sorted keys, no timing data), so the same config and seed give a
byte-identical file on every backend, worker count and start method.

    >>> t = Trajectory(env_id=0, group_id=0, group_uid="0-0", tag="SimpleSokoban",
    ...                env_type="sokoban", seed=10000)
    >>> Trajectory.from_dict(t.to_dict()) == t
    True
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Any

from turnpool.policies.base import Message


@dataclass
class Turn:
    """One LLM turn: the state it saw, what it said, what ran, what came back."""

    state: str
    actions_left: int
    anchor_obs: str = ""
    llm_raw_response: str = ""
    llm_response: str = ""
    format_valid: bool = False
    actions: list[str] = field(default_factory=list)
    n_valid: int = 0
    executed: list[str] = field(default_factory=list)
    reward: float = 0.0
    penalized: bool = False
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    step_group_uid: str = ""


@dataclass
class Trajectory:
    """One env's episode. ``score`` is the unpenalized reward sum; ``normalized_score`` is
    what RL consumes (penalty added, then RAGEN's group normalization)."""

    env_id: int
    group_id: int
    group_uid: str
    tag: str
    env_type: str
    seed: int | None  # None: the env failed to reset
    messages: list[Message] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    final_state: str = ""
    num_actions: int = 0
    penalty: float = 0.0
    success: bool = False
    terminated: bool = False
    truncated: bool = False
    end_reason: str = "running"
    error: str | None = None
    score: float = 0.0
    normalized_score: float = 0.0
    gen_batch: int = 0

    @property
    def rewards(self) -> list[float]:
        """Per-turn rewards (each the sum over that turn's executed actions)."""
        return [t.reward for t in self.turns]

    @property
    def actions(self) -> list[list[str]]:
        """Executed actions, per turn."""
        return [t.executed for t in self.turns]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rewards"] = self.rewards
        return _jsonable(d)  # type: ignore[no-any-return]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["turns"] = [Turn(**t) for t in d.get("turns", [])]
        return cls(**kw)


def _jsonable(x: Any) -> Any:
    """Plain JSON types only (numpy scalars, tuples and non-finite floats handled)."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        return x if math.isfinite(x) else repr(x)
    item = getattr(x, "item", None)  # numpy scalar
    if callable(item):
        return _jsonable(item())
    tolist = getattr(x, "tolist", None)  # numpy array
    if callable(tolist):
        return _jsonable(tolist())
    return repr(x)


def dumps(traj: Trajectory) -> str:
    """One canonical JSON line (no trailing newline)."""
    return json.dumps(traj.to_dict(), sort_keys=True, ensure_ascii=False, allow_nan=False)


def write_jsonl(trajectories: Iterable[Trajectory], dest: str | Path | IO[str]) -> int:
    """Write one line per trajectory; returns the number written."""
    if isinstance(dest, (str, Path)):
        with open(dest, "w", encoding="utf-8") as fh:
            return write_jsonl(trajectories, fh)
    n = 0
    for t in trajectories:
        dest.write(dumps(t) + "\n")
        n += 1
    return n


def read_jsonl(path: str | Path) -> Iterator[Trajectory]:
    """Trajectories back from a file written by :func:`write_jsonl`."""
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield Trajectory.from_dict(json.loads(line))
