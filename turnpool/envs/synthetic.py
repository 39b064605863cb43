"""Synthetic envs for benchmarks and fault tests.

``trivial`` costs about a microsecond per step, ``cpu`` burns a fixed amount of pure-Python CPU
per step, ``sleep`` blocks like a network call, and ``faulty`` misbehaves on command (raise, hang,
kill its own process) so the pool's fault isolation can be exercised for real.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

from turnpool.envs.base import TextEnv


class TrivialEnv(TextEnv):
    """Echo env: the observation names the step count; episodes last ``episode_len`` steps."""

    def __init__(self, episode_len: int = 50, obs_len: int = 96, **config: Any) -> None:
        super().__init__(episode_len=episode_len, obs_len=obs_len, **config)
        self.episode_len = int(episode_len)
        self.obs_len = int(obs_len)
        self.t = 0
        self.value = 0

    def _reset(self, seed: int, options: dict[str, Any]) -> str:
        self.t = 0
        self.value = int(self.np_random.integers(0, 1000))
        return self._render_text()

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.t += 1
        self.value = (self.value * 31 + len(str(action))) % 100_003
        self._work()
        done = self.t >= self.episode_len
        return self._render_text(), float(self.value % 7), False, done, {
            "action_is_effective": True, "t": self.t}

    def _work(self) -> None:
        """Extra per-step cost; nothing for the trivial env."""

    def _render_text(self) -> str:
        head = f"t={self.t} v={self.value} "
        return (head * (self.obs_len // len(head) + 1))[: self.obs_len]

    def anchor_obs(self) -> str:
        return f"v={self.value}"


class CpuEnv(TrivialEnv):
    """Burns ``work_iters`` iterations of pure-Python arithmetic per step (holds the GIL)."""

    def __init__(self, work_iters: int = 20_000, **config: Any) -> None:
        super().__init__(**config)
        self.work_iters = int(work_iters)

    def _work(self) -> None:
        acc = 0
        for i in range(self.work_iters):
            acc = (acc + i * i) % 1_000_003
        self.value = (self.value + acc) % 100_003


class SleepEnv(TrivialEnv):
    """Blocks for ``sleep_ms`` per step, releasing the GIL, like a call to a web service."""

    def __init__(self, sleep_ms: float = 1.0, **config: Any) -> None:
        super().__init__(**config)
        self.sleep_s = float(sleep_ms) / 1000.0

    def _work(self) -> None:
        time.sleep(self.sleep_s)


def _busy(ms_text: str) -> None:
    """Keep the CPU busy for ``ms_text`` milliseconds (bounded; unparsable text: no work)."""
    try:
        ms = min(1000.0, max(0.0, float(ms_text[:16])))
    except ValueError:
        return
    end = time.perf_counter() + ms / 1000.0
    while time.perf_counter() < end:
        pass


class FaultyEnv(TrivialEnv):
    """Misbehaves when told to: action ``"raise"``, ``"hang"``, ``"hang_gil"``, ``"exit"``,
    ``"slow"`` or ``"busy:<ms>"``.

    ``"hang"`` blocks forever in ``time.sleep`` (which releases the GIL, like a stuck network
    call), ``"hang_gil"`` runs inside C code that holds the GIL for a very long time (a regular
    expression that backtracks exponentially), ``"exit"`` ends the whole process with
    ``os._exit`` as a segfaulting extension would, ``"slow"`` takes 0.3 s (a slow web call)
    and is then a normal step, ``"busy:<ms>"`` computes for that many milliseconds (at most
    1,000) before a normal step. Any other action is a normal step.
    """

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if action == "raise":
            raise RuntimeError("FaultyEnv was told to raise")
        if action == "hang":
            while True:
                time.sleep(3600)
        if action == "hang_gil":
            re.match(r"(a+)+$", "a" * 64 + "b")  # ~2**64 backtracking steps, all in C
        if action == "exit":
            os._exit(13)
        if action == "slow":
            time.sleep(0.3)
        if isinstance(action, str) and action.startswith("busy:"):
            _busy(action[5:])
        return super()._step(action)
