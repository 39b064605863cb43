"""Inputs of the viewer tests, written by real ``turnpool rollout`` runs (Sokoban, 2 groups of
3, the oracle with random slips so that some episodes fail): a trajectory JSONL with its
record, the same trajectories as Parquet, and a best-of-N tree."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from turnpool.cli import main

SMALL = ["--no-progress", "--backend", "sequential", "--seed", "3",
         "es_manager.train.env_groups=2", "es_manager.train.env_configs.n_groups=[2]",
         "es_manager.train.group_size=3", "turnpool.policy.oracle.epsilon=0.8",
         "agent_proxy.max_actions_per_turn=1"]


def _rollout(*args: str) -> None:
    res = CliRunner().invoke(main, ["rollout", *SMALL, *args])
    assert res.exit_code == 0, res.output


@pytest.fixture(scope="session")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``rollout`` (JSONL), ``parquet``, ``record`` (.jsonl.gz) and ``tree`` files."""
    d = tmp_path_factory.mktemp("view-inputs")
    files = {"rollout": d / "t.jsonl", "parquet": d / "t.parquet",
             "record": d / "run.jsonl.gz", "tree": d / "tree.jsonl"}
    _rollout("--out", str(files["rollout"]), "--record", str(files["record"]))
    _rollout("--out", str(files["parquet"]))
    _rollout("turnpool.collector.tree.mode=best_of_n", "--tree-out", str(files["tree"]))
    return files
