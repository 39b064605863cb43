"""A tiny env for RAGEN v2's manager rules: a 2048-like counter that reports ``grid``,
``score``, ``raw_reward`` and a text info value on every action."""

from __future__ import annotations

from typing import Any

from turnpool.envs.base import TextEnv


class TileEnv(TextEnv):
    """Actions ``grow`` (tile doubles, raw reward = new tile) and ``stop`` (ends)."""

    action_lookup = {0: "grow", 1: "stop"}

    def _reset(self, seed: int, options: dict[str, Any]) -> str:
        self.tile, self.score = 2, 0
        return "tile 2"

    def _render_text(self) -> str:
        return f"tile {self.tile}"

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if action == 1:
            return f"tile {self.tile}", 0.0, True, False, {
                "raw_reward": 0.0, "score": self.score, "note": "stopped", "success": True}
        self.tile *= 2
        self.score += self.tile
        return f"tile {self.tile}", 0.1, False, False, {
            "raw_reward": float(self.tile), "score": self.score, "grid": [[self.tile, 0]],
            "note": f"grew to {self.tile}", f"step_{self.tile}": 1.0}
