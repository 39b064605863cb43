"""A one-dimensional walk that draws ``rgb_array`` frames and has no frame hook: the viewer
can only draw it by replaying an episode (`turnpool.view.boards`)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from turnpool.envs.base import TextEnv


class LineEnv(TextEnv):
    action_lookup: ClassVar[dict[int, str] | None] = {0: "Left", 1: "Right"}
    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["text", "rgb_array"],
                                          "render_fps": 1}
    SIZE = 5

    def _reset(self, seed: int, options: dict[str, Any]) -> str:
        self.pos = int(self.np_random.integers(self.SIZE))
        return self._render_text()

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if action is not None:
            self.pos = min(self.SIZE - 1, max(0, self.pos + (1 if action == 1 else -1)))
        done = self.pos == self.SIZE - 1
        return self._render_text(), float(done), done, False, {"success": done}

    def _render_text(self) -> str:
        return "".join("P" if k == self.pos else "_" for k in range(self.SIZE))

    def render(self, mode: str | None = None) -> Any:
        if mode != "rgb_array":
            return self._render_text()
        frame = np.zeros((1, self.SIZE, 3), dtype=np.uint8)
        frame[0, self.pos] = (255, 0, 0)
        return frame
