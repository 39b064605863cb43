"""Served snapshots: a pool `Snapshot` as a JSON value that a client holds, and back.

The value names the env, its identity (entry point and kwargs), the episode's seed and the
turns since its reset (each a list of the actions the client sent), signed with the server's
``snapshot_key`` (HMAC-SHA256 over all of it)::

    {"format": "turnpool.snapshot/1", "env": "sokoban", "env_key": "...", "seed": 3,
     "turns": [["Up"], ["Down"]], "mac": "9f2c..."}

The env's internal state is not in it: a served restore resets the episode's seed and
replays the turns (the pool's path for envs branched by replay), so nothing a client sends
becomes an env's state but actions, which a step accepts anyway, and nothing is unpickled.
`SnapshotCodec.decode` refuses, with a `ProtocolError`, anything that is not such a value
within the server's bounds, a snapshot of another env, and one whose MAC does not match (a
changed value, or one signed with another key: another server's, unless they share one).

>>> codec = SnapshotCodec("sokoban", "k", max_action_chars=100, max_actions=4)
>>> snap = Snapshot("sokoban()", 3, (("Up",), ("Down", "Left")))
>>> value = codec.encode(snap)
>>> value["seed"], value["turns"], codec.decode(value) == snap
(3, [['Up'], ['Down', 'Left']], True)
>>> try:
...     codec.decode({**value, "seed": 4})
... except ProtocolError as exc:
...     print(exc.code, exc.message)
VALIDATION_ERROR snapshot refused: it was changed, or made by a server with another snapshot key
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from turnpool.pool.branch import Snapshot
from turnpool.serve.errors import ProtocolError

#: The ``format`` of a served snapshot value.
FORMAT = "turnpool.snapshot/1"
#: Most turns a served snapshot may carry (its message is bounded as any other, too).
MAX_SNAPSHOT_TURNS = 100_000
_FIELDS = frozenset({"format", "env", "env_key", "seed", "turns", "mac"})


class SnapshotCodec:
    """Snapshots of ``env`` to and from JSON values, signed with ``key``; actions are bounded
    as a step's are (``max_action_chars``, ``max_actions`` per turn)."""

    def __init__(self, env: str, key: str, max_action_chars: int, max_actions: int) -> None:
        self.env = env
        self._key = key.encode()
        self.max_action_chars = max_action_chars
        self.max_actions = max_actions

    def encode(self, snap: Snapshot) -> dict[str, Any]:
        """``snap`` as a JSON value (its env state is left out: restore replays the turns)."""
        turns = [list(t) for t in snap.turns]
        return {"format": FORMAT, "env": self.env, "env_key": snap.env_key,
                "seed": snap.seed, "turns": turns,
                "mac": self._mac(snap.env_key, snap.seed, turns)}

    def decode(self, value: Any) -> Snapshot:
        """The `Snapshot` of a value `encode` made here (state None: restored by replay);
        ``VALIDATION_ERROR`` for anything else."""
        if not isinstance(value, dict) or set(value) != _FIELDS or \
                value["format"] != FORMAT:
            raise _refused(f"not a turnpool snapshot (an object of {sorted(_FIELDS)}, "
                           f"format {FORMAT!r})")
        if value["env"] != self.env:
            raise _refused(f"this server plays {self.env}; the snapshot is of "
                           f"{str(value['env'])[:100]}")
        env_key, seed, turns, mac = (value[k] for k in ("env_key", "seed", "turns", "mac"))
        if not isinstance(env_key, str) or len(env_key) > 100_000 or not isinstance(mac, str):
            raise _refused("env_key and mac must be strings")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise _refused("seed must be a non-negative integer")
        self._check_turns(turns)
        if not hmac.compare_digest(mac.encode(), self._mac(env_key, seed, turns).encode()):
            raise _refused("it was changed, or made by a server with another snapshot key")
        return Snapshot(env_key, seed, tuple(tuple(t) for t in turns))

    def _check_turns(self, turns: Any) -> None:
        if not isinstance(turns, list) or len(turns) > MAX_SNAPSHOT_TURNS:
            raise _refused(f"turns must be a list of at most {MAX_SNAPSHOT_TURNS} turns")
        for turn in turns:
            if not isinstance(turn, list) or not 0 < len(turn) <= self.max_actions:
                raise _refused(f"each turn is a list of 1..{self.max_actions} actions")
            for a in turn:
                if isinstance(a, bool) or not isinstance(a, (str, int)) or \
                        isinstance(a, str) and len(a) > self.max_action_chars:
                    raise _refused("an action is an integer or a string of at most "
                                   f"{self.max_action_chars} chars")

    def _mac(self, env_key: str, seed: int, turns: list[list[Any]]) -> str:
        body = json.dumps([FORMAT, self.env, env_key, seed, turns], separators=(",", ":"),
                          ensure_ascii=True)
        return hmac.new(self._key, body.encode(), hashlib.sha256).hexdigest()


def _refused(why: str) -> ProtocolError:
    return ProtocolError("VALIDATION_ERROR", f"snapshot refused: {why}", status=422)


__all__ = ["FORMAT", "MAX_SNAPSHOT_TURNS", "SnapshotCodec"]
