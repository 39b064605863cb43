"""``turnpool rollout`` and ``turnpool envs`` through click's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from turnpool.cli import main
from turnpool.rollout.trajectory import read_jsonl

pytestmark = pytest.mark.timeout(120)

SMALL = ["es_manager.train.env_groups=2", "es_manager.train.env_configs.n_groups=[2]",
         "es_manager.train.group_size=4", "es_manager.train.env_configs.tags=[FrozenLake]",
         "turnpool.backend=sequential"]


def test_rollout_writes_summary_json_and_trajectories(tmp_path: Path) -> None:
    summary, out = tmp_path / "s.json", tmp_path / "t.jsonl"
    res = CliRunner().invoke(main, ["rollout", "--no-progress", *SMALL, "--json", str(summary),
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "env-steps/s" in res.output and "policy time" in res.output
    assert "FrozenLake" in res.output
    data = json.loads(summary.read_text())
    assert data["backend"] == "sequential" and data["num_groups"] == 2
    m = data["metrics"]
    assert m["trajectories"] == 8 and "FrozenLake/pass@4" in m
    assert m["env_steps_per_s"] > 0 and m["timing/env_s"] >= 0
    trajs = list(read_jsonl(out))
    assert len(trajs) == 8 and {t.group_id for t in trajs} == {0, 1}
    # same config and seed: the same file again
    again = tmp_path / "t2.jsonl"
    res = CliRunner().invoke(main, ["rollout", "--no-progress", *SMALL, "--out", str(again)])
    assert res.exit_code == 0 and again.read_bytes() == out.read_bytes()


def test_rollout_with_a_config_file_and_progress(tmp_path: Path) -> None:
    cfg = Path(__file__).resolve().parents[2] / "configs" / "bandit.yaml"
    res = CliRunner().invoke(main, ["rollout", "--config", str(cfg),
                                    "es_manager.train.env_groups=2",
                                    "es_manager.train.env_configs.n_groups=[2]"])
    assert res.exit_code == 0, res.output
    assert "Bandit" in res.output


def test_rollout_config_errors_are_usage_errors(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["rollout", "turnpool.num_wokers=3"])
    assert res.exit_code == 2
    assert "turnpool.num_wokers" in res.output and "command-line overrides" in res.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("es_manager:\n  format_penalty: lots\n")
    res = CliRunner().invoke(main, ["rollout", "--config", str(bad)])
    assert res.exit_code == 2 and str(bad) in res.output.replace("\n", "")


def test_envs_lists_registered_envs_and_tags(tmp_path: Path) -> None:
    out = tmp_path / "envs.json"
    res = CliRunner().invoke(main, ["envs", "--json", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    rows = {r["name"]: r for r in data["envs"]}
    assert {"frozen_lake", "bandit", "countdown"} <= set(rows)
    assert rows["frozen_lake"]["actions"] == ["Left", "Down", "Right", "Up"]
    assert rows["frozen_lake"]["defaults"]["size"] == 4
    assert rows["bandit"]["actions"] == ["phoenix", "dragon"]
    assert "SimpleSokoban" in {t["tag"] for t in data["tags"]}
    assert "frozen_lake" in res.output
