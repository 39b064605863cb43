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
def test_env_runs_every_built_in_env_with_the_default_policy_or_refuses_in_one_line(
        name: str, tmp_path: Path) -> None:
    summary = tmp_path / "s.json"
    res = CliRunner().invoke(main, ["rollout", "--env", name, *SHORT, "--json", str(summary)])
    if not _has_oracle(name):
        assert res.exit_code == 2, res.output
        lines = [line for line in res.output.splitlines() if line.strip()]
        assert len(lines) == 1 and f"env {name!r}" in lines[0], res.output
        assert "--policy random" in lines[0]
        res = CliRunner().invoke(main, ["rollout", "--env", name, *SHORT, "--policy", "random",
                                        "--json", str(summary)])
    assert res.exit_code == 0, res.output
    data = json.loads(summary.read_text())
    assert data["tags"] == [name] and data["num_groups"] == 2 and data["group_size"] == 2
    assert data["metrics"][f"{name}/trajectories"] == 4


def test_the_default_policy_succeeds_on_every_env_that_has_an_oracle(tmp_path: Path) -> None:
    solved = []
    for name in [n for n in BUILT_IN if _has_oracle(n)]:
        summary = tmp_path / f"{name}.json"
        res = CliRunner().invoke(main, ["rollout", "--env", name, "--groups", "2",
                                        "--group-size", "2", "--no-progress",
                                        "turnpool.backend=sequential", "--json", str(summary)])
        assert res.exit_code == 0, res.output
        if json.loads(summary.read_text())["metrics"][f"{name}/success"] > 0:
            solved.append(name)
    assert solved == [n for n in BUILT_IN if _has_oracle(n)]


def test_env_also_names_a_tag_of_the_config_and_refuses_what_is_neither() -> None:
    res = CliRunner().invoke(main, ["rollout", "--env", "FrozenLake", *SHORT])
    assert res.exit_code == 0 and "FrozenLake" in res.output, res.output
    res = CliRunner().invoke(main, ["rollout", "--env", "sokobann", *SHORT])
    assert res.exit_code == 2
    assert "did you mean 'sokoban'" in res.output and "Traceback" not in res.output
