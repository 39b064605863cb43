"""Library envs by name outside `make`: a config's ``env_type`` in ``turnpool rollout``,
``turnpool envs --hub`` (ids and whether each runs offline), and the one-line refusals."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from turnpool.cli import main
from turnpool.envs.hub_table import Hub
from turnpool.extras import MissingExtra


def test_a_config_names_library_envs_as_env_type(tmp_path: Path) -> None:
    config = tmp_path / "hubs.yaml"
    config.write_text(textwrap.dedent('''
        custom_envs:
          Legs:
            env_type: "rg:leg_counting"
            max_actions_per_traj: 1
            env_config: {size: 20}
          Guess:
            env_type: "gem:game:GuessTheNumber-v0-easy"
            max_actions_per_traj: 4
        agent_proxy: {max_turn: 4}
        es_manager:
          train:
            env_groups: 2
            group_size: 2
            env_configs: {tags: [Legs, Guess], n_groups: [1, 1]}
        turnpool:
          backend: process
          num_workers: 2
          policy: {name: random}
    '''))
    summary = tmp_path / "summary.json"
    proc = subprocess.run(
        [sys.executable, "-c", "from turnpool.cli import main; main()", "rollout",
         "--no-progress", "--config", str(config), "--json", str(summary)],
        capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert json.loads(summary.read_text())["metrics"]["trajectories"] == 4


def test_envs_hub_lists_every_id_and_why_one_does_not_run(tmp_path: Path) -> None:
    out = tmp_path / "skyrl.json"
    res = CliRunner().invoke(main, ["envs", "--hub", "skyrl-gym", "--json", str(out)])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(out.read_text())}
    assert {"skyrl:gsm8k", "skyrl:aime", "skyrl:text2sql"} <= set(rows)
    assert rows["skyrl:gsm8k"]["runs"] is True and rows["skyrl:gsm8k"]["reason"] == ""
    assert rows["skyrl:text2sql"]["runs"] is False
    assert "needs tasks=" in rows["skyrl:text2sql"]["reason"]


def test_an_unknown_library_is_one_line() -> None:
    res = CliRunner().invoke(main, ["envs", "--hub", "nosuch"])
    assert res.exit_code != 0 and "unknown env library 'nosuch'" in res.output
    assert "Traceback" not in res.output


def test_a_missing_library_names_its_extra_in_one_line() -> None:
    absent = Hub("zz", "no_such_library_zz", "zz-extra", "ZZ", "turnpool.envs.hubs.rg:X")
    with pytest.raises(MissingExtra) as err:
        absent.require()
    assert str(err.value) == ("ZZ envs (zz:...) needs no_such_library_zz: "
                              "pip install 'turnpool[zz-extra]'")
