"""User envs for the projection tests, registered by name on import (registration is
per process, and the two projection test files may run in different workers)."""

from __future__ import annotations

from typing import ClassVar

from turnpool.envs.base import TextEnv
from turnpool.envs.registry import register


class _GridEnv(TextEnv):
    """A user env registered by entry point, with its own action table (0 is a real id)."""

    action_lookup: ClassVar[dict[int, str] | None] = {0: "Stay", 1: "Jump", 2: "Duck"}


class _FreeTextEnv(TextEnv):
    """A user env without an action table: any text is an action."""


class _ShuffledEnv(TextEnv):
    """A user env whose id -> name table changes per episode, like bandit's arms."""

    action_lookup: ClassVar[dict[int, str] | None] = {1: "Red", 2: "Blue"}

    def action_lookup_for_episode(self) -> dict[int, str] | None:
        return {1: "Blue", 2: "Red"}


class _NoNamesEnv(TextEnv):
    """Names that change per episode, none known before a reset."""

    action_kind: ClassVar[str | None] = "names"


register("projection_test_nonames", f"{__name__}:_NoNamesEnv")
register("projection_test_grid", f"{__name__}:_GridEnv")
register("projection_test_free", f"{__name__}:_FreeTextEnv")
register("projection_test_shuffled", f"{__name__}:_ShuffledEnv")
