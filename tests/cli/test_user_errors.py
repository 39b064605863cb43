"""Errors from a user's env and config are one line naming the cause (the exception's type and
message), with the exit codes of docs/reliability.md: an env whose ``step`` raises, a config
that is not YAML, an entry point that cannot be loaded, an env that lacks a hook."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import turnpool
from turnpool.cli import main
from turnpool.cli.errors import EXIT_TOO_MANY_FAILURES, EXIT_USAGE
from turnpool.envs.base import TextEnv

pytestmark = pytest.mark.timeout(120)

HERE = __name__


class StepRaises(TextEnv):
    def _reset(self, seed: int, options: dict[str, Any]) -> str:
        return "start"

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        raise RuntimeError("the user's step exploded")

    def _render_text(self) -> str:
        return "state"


class NoRenderText(TextEnv):
    def _reset(self, seed: int, options: dict[str, Any]) -> str:
        return "start"

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return "next", 0.0, True, False, {}


def _user_env_run(entry_point: str, backend: str = "sequential") -> list[str]:
    return ["rollout", "--no-progress", "--policy", "random",
            "es_manager.train.env_groups=2", "es_manager.train.env_configs.n_groups=[2]",
            "es_manager.train.group_size=2", "es_manager.train.env_configs.tags=[Mine]",
            "agent_proxy.max_turn=2", f"turnpool.backend={backend}",
            f"+custom_envs.Mine.env_type={entry_point}",
            "+custom_envs.Mine.max_actions_per_traj=3"]


def _one_error(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, output
    assert "Traceback" not in output
    return lines[0]


@pytest.mark.parametrize("backend", ["sequential", "process"])
def test_a_user_env_whose_step_raises_names_the_first_cause(backend: str) -> None:
    # process: the exception's type and message cross the worker's pipe
    res = CliRunner().invoke(main, _user_env_run(f"{HERE}:StepRaises", backend))
    assert res.exit_code == EXIT_TOO_MANY_FAILURES, res.output
    line = _one_error(res.output)
    assert "100% of episodes failed after retries" in line
    assert "first: env_error: RuntimeError: the user's step exploded" in line


def test_an_env_without_render_text_says_which_hook_is_missing() -> None:
    res = CliRunner().invoke(main, _user_env_run(f"{HERE}:NoRenderText"))
    assert res.exit_code == EXIT_TOO_MANY_FAILURES, res.output
    assert "NotImplementedError: NoRenderText must define _render_text()" in _one_error(
        res.output)
    with pytest.raises(NotImplementedError, match="NoRenderText must define _render_text"):
        turnpool.make(f"{HERE}:NoRenderText").reset(seed=0)


@pytest.mark.parametrize(("entry_point", "cause"), [
    (f"{HERE}:NoSuchClass", f"AttributeError: module '{HERE}' has no attribute 'NoSuchClass'"),
    ("no_such_module_xyz:Env", "ModuleNotFoundError: No module named 'no_such_module_xyz'"),
])
def test_a_bad_entry_point_is_one_line_with_its_cause(entry_point: str, cause: str) -> None:
    res = CliRunner().invoke(main, _user_env_run(entry_point))
    assert res.exit_code == EXIT_USAGE, res.output
    line = _one_error(res.output)
    assert f"custom_envs.Mine.env_type: cannot load env '{entry_point}': {cause}" in line


def test_a_config_that_is_not_yaml_is_one_line_with_where(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("es_manager:\n  train: [unclosed\n   foo: : :\n", encoding="utf-8")
    res = CliRunner().invoke(main, ["rollout", "--no-progress", "--config", str(bad)])
    assert res.exit_code == EXIT_USAGE, res.output
    line = _one_error(res.output)
    assert f"config file {bad} is not valid YAML: ParserError: did not find expected" in line
    assert "(line 3, column 7)" in line
