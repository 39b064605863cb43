"""How a worker gets its envs: `EnvBuild` (one env's recipe, built in any process through
the env registry) and `split_evenly` (which worker holds which env ids)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from turnpool.envs.base import TextEnv
from turnpool.envs.registry import make


@dataclass(frozen=True)
class EnvBuild:
    """How to build env ``env_id`` in any process: an entry point string and its kwargs.

    The pool resolves registered names to ``"module.path:ClassName"`` before shipping, so envs
    registered only in the parent still build in spawned workers.
    """

    env_id: int
    entry_point: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    #: build it at its first reset (or restore) instead of when its worker starts
    lazy: bool = False

    def build(self) -> TextEnv:
        return make(self.entry_point, **self.kwargs)


def split_evenly(env_ids: Sequence[int], num_workers: int) -> list[list[int]]:
    """Contiguous, near-equal slices (groups are contiguous, so most stay in one worker)."""
    n = len(env_ids)
    w = max(1, min(num_workers, n)) if n else 1
    bounds = [round(k * n / w) for k in range(w + 1)]
    return [list(env_ids[bounds[k]:bounds[k + 1]]) for k in range(w)]
