"""``turnpool rollout`` and ``turnpool envs`` through click's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.cli.small import SMALL_LAKE
from turnpool.cli import main
from turnpool.rollout.trajectory import read_jsonl

pytestmark = pytest.mark.timeout(120)

SMALL = SMALL_LAKE


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
    res = CliRunner().invoke(main, ["rollout", "--no-progress", "turnpool.step_timeout=-1"])
    assert res.exit_code == 2 and "step_timeout must be > 0" in res.output


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


# ------------------------------------------------------------------- output for people
def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines()]


def _invoke(args: list[str], columns: int) -> Any:
    res = CliRunner(env={"COLUMNS": str(columns)}).invoke(main, args)
    assert res.exit_code == 0, res.output
    return res


@pytest.mark.parametrize("columns", [80, 60])
def test_rollout_summary_fits_without_cut_headers(tmp_path: Path, columns: int) -> None:
    summary = tmp_path / "s.json"
    res = _invoke(["rollout", "--no-progress", *SMALL, "--json", str(summary)], columns)
    lines = _lines(res.stdout)
    assert max(len(line) for line in lines) <= columns
    assert "…" not in res.stdout
    for header in ("success", "pass@4", "valid", "penalty", "actions", "errors",
                   "env-steps/s", "policy time per turn"):
        assert header in res.stdout
    # the numbers are whole: the success rate printed is the one in the JSON
    success = json.loads(summary.read_text())["metrics"]["FrozenLake/success"]
    assert f"{success:.3f}" in res.stdout


def test_rollout_summary_is_one_row_per_tag_at_80_columns() -> None:
    res = _invoke(["rollout", "--no-progress", *SMALL], 80)
    header = next(line for line in _lines(res.stdout) if line.startswith("tag"))
    assert header.split() == ["tag", "n", "success", "pass@4", "valid", "penalty", "actions",
                              "score", "errors"]


def test_envs_fits_80_columns_without_broken_words() -> None:
    res = _invoke(["envs"], 80)
    lines = _lines(res.stdout)
    assert max(len(line) for line in lines) <= 80 and "…" not in res.stdout
    words = " ".join(lines).split()
    for token in ("search_depth=300,", "hi_arm_hiscore_prob=0.25,", "max_search_chars=500,",
                  "is_slippery=True,"):
        assert token in words, token  # a whole word on one line, never split


def test_bench_pool_fits_80_columns_and_reports_progress(tmp_path: Path) -> None:
    res = _invoke(["bench", "pool", "--backends", "sequential,process", "--envs", "trivial",
                   "--no-gym", "--min-time", "0.01", "--repeats", "1"], 80)
    lines = _lines(res.stdout)
    assert max(len(line) for line in lines) <= 80 and "…" not in res.stdout
    assert "measured" in res.stdout and "process trivial overhead N=8" in res.stdout
    # not a terminal: one progress line per configuration on stderr (the floor row last)
    assert "[0/3] measuring trivial sequential N=8" in res.stderr
    assert "[1/3] measuring trivial process N=8" in res.stderr
    assert "[2/3] measuring trivial bare_pipes N=8" in res.stderr
    assert "process backend / its floor" in res.stdout


# --------------------------------------------------------------------------- CLI sugar
def test_version_and_examples_in_help() -> None:
    from turnpool import __version__

    assert _invoke(["--version"], 80).stdout.strip() == f"turnpool, version {__version__}"
    top = _invoke(["--help"], 80).stdout
    assert "Examples:" in top and "turnpool rollout --backend process" in top
    sub = _invoke(["rollout", "--help"], 80).stdout
    for option in ("--backend", "--workers", "--policy", "--seed", "Examples:"):
        assert option in sub
    assert "--full" in _invoke(["bench", "pool", "--help"], 80).stdout


def test_shorthand_options_set_the_dotlist_keys(tmp_path: Path) -> None:
    summary = tmp_path / "s.json"
    base = [a for a in SMALL if not a.startswith("turnpool.backend")]
    _invoke(["rollout", "--no-progress", *base, "--backend", "thread", "--workers", "2",
             "--policy", "random", "--seed", "11", "--json", str(summary)], 80)
    data = json.loads(summary.read_text())
    assert (data["backend"], data["num_workers"], data["policy"]) == ("thread", 2, "random")


def test_invalid_backend_lists_each_choice_once() -> None:
    for args in (["rollout", "--backend", "nope"], ["rollout", "turnpool.backend=nope"]):
        res = CliRunner().invoke(main, args)
        assert res.exit_code in (1, 2), res.output  # a usage error or a config error
        assert res.output.count("auto") == 1 and "sequential" in res.output


def test_rollout_tree_mode_writes_trajectories_and_tree_nodes(tmp_path: Path) -> None:
    out, tree, summary = tmp_path / "t.jsonl", tmp_path / "tree.jsonl", tmp_path / "s.json"
    res = CliRunner().invoke(main, ["rollout", "--no-progress", *SMALL,
                                    "turnpool.collector.tree.mode=best_of_n",
                                    "--out", str(out), "--tree-out", str(tree),
                                    "--json", str(summary)])
    assert res.exit_code == 0, res.output
    assert "tree: nodes / forks" in res.output
    trajectories = list(read_jsonl(out))
    nodes = [json.loads(line) for line in tree.read_text().splitlines()]
    metrics = json.loads(summary.read_text())["metrics"]
    assert len(nodes) == metrics["tree/nodes"] > len(trajectories) == 8
    ids = {n["node_id"] for n in nodes}
    assert all(n["parent_id"] is None or n["parent_id"] in ids for n in nodes)
    assert sum(t.chosen is True for t in trajectories) == 2  # one chosen path per group
    assert all(t.node_id in ids for t in trajectories)


def test_rollout_refuses_tree_modes_with_the_async_collector() -> None:
    res = CliRunner().invoke(main, ["rollout", "--no-progress", *SMALL,
                                    "turnpool.collector.tree.mode=beam",
                                    "turnpool.collector.mode=async"])
    assert res.exit_code == 2
    assert "needs the lockstep collector" in res.output
