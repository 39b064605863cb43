"""Adding an env is one file (+ one ``register`` line for a short name): nothing else in
turnpool names envs. A new env written to a fresh module outside the package runs through
``make``, the projection, every kind of pool worker (a spawned process imports it by entry
point) and a full ``turnpool rollout`` with its own oracle.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import turnpool
from turnpool.envs.registry import registered

ENV_SOURCE = textwrap.dedent('''
    from typing import Any

    from turnpool.envs.base import TextEnv


    class CorridorEnv(TextEnv):
        """Walk along a corridor to the goal G."""

        action_kind = "discrete"
        action_lookup = {1: "Left", 2: "Right"}
        grid_vocab = {"P": "player", "G": "goal", "_": "floor"}
        instruction = "Walk to G. Answer with moves, e.g. <answer>Left || Left</answer>."

        def __init__(self, length: int = 7, **config: Any) -> None:
            super().__init__(length=length, **config)
            self.length = int(length)
            self.pos = self.goal = 0

        def _reset(self, seed: int, options: dict[str, Any]) -> str:
            self.pos, self.goal = (int(x) for x in self.np_random.choice(self.length, 2,
                                                                         replace=False))
            return self._render_text()

        def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
            if action is None:
                return self._render_text(), 0.0, False, False, {"action_is_valid": False}
            old = self.pos
            self.pos = min(max(self.pos + (1 if action == 2 else -1), 0), self.length - 1)
            done = self.pos == self.goal
            return self._render_text(), float(done), done, False, {
                "success": done, "action_is_effective": self.pos != old}

        def _render_text(self) -> str:
            return "".join("P" if i == self.pos else "G" if i == self.goal else "_"
                           for i in range(self.length))


    def oracle(obs: str, env_config: Any = None) -> list[str]:
        p, g = obs.index("P"), obs.index("G")
        return ["Right" if g > p else "Left"] * abs(g - p)


    CorridorEnv.oracle = staticmethod(oracle)
''')


@pytest.fixture()
def corridor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "corridor_env.py").write_text(ENV_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    # spawned workers and the CLI subprocess find the module the same way a user's would
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]))
    turnpool.register("corridor", entry_point="corridor_env:CorridorEnv")
    yield "corridor"
    # the registry is module state: leave it as it was
    from turnpool.envs import registry
    registry._REGISTRY.pop("corridor", None)
    sys.modules.pop("corridor_env", None)


def test_a_new_env_is_one_file_and_one_register_line(corridor: str) -> None:
    assert corridor in registered()
    env = turnpool.make(corridor, length=5)
    obs, info = env.reset(seed=3)
    assert len(obs) == 5 and obs.count("P") == 1 and obs.count("G") == 1
    project = turnpool.create_projection_function(corridor)
    actions, valids = project(["<answer>Right</answer>", "<answer>jump</answer>"])
    assert actions[0] == 2 and valids == [True, False]
    results = []
    for backend in ("sequential", "process"):
        with turnpool.EnvPool(corridor, env_num=2, group_n=2, seed=7, backend=backend,
                              num_workers=2, step_timeout=30.0) as pool:
            first = pool.reset()
            results.append((first, pool.step([2, 1, 2, 1])))
            assert pool.env_seeds == [7, 7, 8, 8]
    assert results[0] == results[1]


def test_a_new_env_runs_a_full_rollout_with_its_oracle(corridor: str, tmp_path: Path) -> None:
    config = tmp_path / "corridor.yaml"
    config.write_text(textwrap.dedent('''
        custom_envs:
          Corridor:
            env_type: "corridor_env:CorridorEnv"
            max_actions_per_traj: 20
            env_config: {length: 6}
        agent_proxy: {max_turn: 4}
        es_manager:
          train:
            env_groups: 2
            group_size: 2
            env_configs: {tags: [Corridor], n_groups: [2]}
        turnpool:
          backend: process
          num_workers: 2
          policy: {name: oracle, oracle: {epsilon: 0.0}}
    '''))
    summary = tmp_path / "summary.json"
    proc = subprocess.run(
        [sys.executable, "-c", "from turnpool.cli import main; main()", "rollout",
         "--no-progress", "--config", str(config), "--json", str(summary)],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    metrics = json.loads(summary.read_text())["metrics"]
    assert metrics["trajectories"] == 4
    assert metrics["Corridor/success"] == 1.0
