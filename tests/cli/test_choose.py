"""``turnpool rollout --env NAME --groups G --group-size S``: every built-in env from the
command line, the default policy playing it or refusing in one line that names what works."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from turnpool.cli import main
from turnpool.cli.errors import is_test_env
from turnpool.envs.registry import oracle_for, registered

pytestmark = pytest.mark.timeout(300)

BUILT_IN = sorted(n for n, spec in registered().items() if not is_test_env(spec.entry_point))
SHORT = ["--groups", "2", "--group-size", "2", "--no-progress", "agent_proxy.max_turn=2",
         "turnpool.backend=sequential"]


def _has_oracle(name: str) -> bool:
    try:
        oracle_for(name)
    except LookupError:
        return False
    return True


@pytest.mark.parametrize("name", BUILT_IN)
def test_env_runs_every_built_in_env_with_the_default_policy(name: str, tmp_path: Path) -> None:
    summary = tmp_path / "s.json"
    res = CliRunner().invoke(main, ["rollout", "--env", name, *SHORT, "--json", str(summary)])
    assert res.exit_code == 0, res.output
    data = json.loads(summary.read_text())
    assert data["tags"] == [name] and data["num_groups"] == 2 and data["group_size"] == 2
    assert data["metrics"][f"{name}/trajectories"] == 4


def test_an_env_without_an_oracle_is_refused_in_one_line_naming_what_works(
        tmp_path: Path) -> None:
    assert not _has_oracle("trivial")  # a test env: it declares no solver
    res = CliRunner().invoke(main, ["rollout", "--env", "trivial", *SHORT])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "env 'trivial'" in lines[0] and "--policy random" in lines[0]
    summary = tmp_path / "s.json"
    res = CliRunner().invoke(main, ["rollout", "--env", "trivial", *SHORT, "--policy", "random",
                                    "--json", str(summary)])
    assert res.exit_code == 0, res.output
    assert json.loads(summary.read_text())["metrics"]["trivial/trajectories"] == 4


#: what an env needs beyond its defaults for its oracle to finish an episode: a 9x9 Sudoku
#: needs 32 placements (the default budget is 10 actions; a 4x4 one needs 6), and 2048 ends
#: with success only when no move is left and a 2048 tile is on the board: 1,000-1,800 moves
#: of the two-ply heuristic, without noise (one episode, about 10 s here)
TO_SUCCEED = {
    "sudoku": ["custom_envs.sudoku.env_config.grid_size=4"],
    "game_2048": ["--groups", "1", "--group-size", "1", "agent_proxy.max_turn=2500",
                  "custom_envs.game_2048.max_actions_per_traj=2500",
                  "turnpool.policy.oracle.epsilon=0"],
}


@pytest.mark.parametrize("name", BUILT_IN)
def test_the_default_policy_succeeds_on_every_built_in_env(name: str, tmp_path: Path) -> None:
    assert _has_oracle(name)
    summary = tmp_path / f"{name}.json"
    res = CliRunner().invoke(main, ["rollout", "--env", name, "--groups", "2", "--group-size",
                                    "2", "--no-progress", "turnpool.backend=sequential",
                                    *TO_SUCCEED.get(name, []), "--json", str(summary)])
    assert res.exit_code == 0, res.output
    assert json.loads(summary.read_text())["metrics"][f"{name}/success"] > 0


def test_env_also_names_a_tag_of_the_config_and_refuses_what_is_neither() -> None:
    res = CliRunner().invoke(main, ["rollout", "--env", "FrozenLake", *SHORT])
    assert res.exit_code == 0 and "FrozenLake" in res.output, res.output
    res = CliRunner().invoke(main, ["rollout", "--env", "sokobann", *SHORT])
    assert res.exit_code == 2
    assert "did you mean 'sokoban'" in res.output and "Traceback" not in res.output
