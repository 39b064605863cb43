"""A multi-batch ``turnpool rollout`` tells the truth about the whole run: its summary, its
``--json``, its ``--out`` file after Ctrl-C, and its progress bar."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.cli.small import SMALL_LAKE
from turnpool.cli import main
from turnpool.cli.rollout import _WholeBatches
from turnpool.rollout.trajectory import read_jsonl

pytestmark = pytest.mark.timeout(120)

LAKE = SMALL_LAKE


def test_the_summary_and_json_cover_every_batch(tmp_path: Path) -> None:
    summary, out = tmp_path / "s.json", tmp_path / "t.jsonl"
    res = CliRunner().invoke(main, ["rollout", "--no-progress", *LAKE, "--batches", "3",
                                    "--json", str(summary), "--out", str(out)])
    assert res.exit_code == 0, res.output
    written = list(read_jsonl(out))
    data = json.loads(summary.read_text())
    m = data["metrics"]
    assert len(written) == 24 and m["FrozenLake/trajectories"] == 24 == m["trajectories"]
    assert m["FrozenLake/success"] == pytest.approx(sum(t.success for t in written) / 24)
    assert [b["trajectories"] for b in data["batches"]] == [8, 8, 8]
    assert m["env_steps"] == sum(b["metrics"]["env_steps"] for b in data["batches"])
    per_batch = [b["metrics"]["FrozenLake/success"] for b in data["batches"]]
    assert m["FrozenLake/success"] == pytest.approx(sum(per_batch) / 3)
    assert "rollout, 3 batches" in res.output and "per batch" in res.output
    assert re.search(r"FrozenLake\s+24\s", res.output)


def test_an_interrupted_write_leaves_the_last_whole_batch(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    out = _WholeBatches(str(path))

    class Interrupted:
        def to_dict(self) -> dict[str, object]:
            raise KeyboardInterrupt

    runner = CliRunner()
    res = runner.invoke(main, ["rollout", "--no-progress", *LAKE,
                               "--out", str(tmp_path / "a.jsonl")])
    assert res.exit_code == 0, res.output
    batch = list(read_jsonl(tmp_path / "a.jsonl"))
    out.add(batch)
    with pytest.raises(KeyboardInterrupt):
        out.add([*batch[:3], Interrupted()])  # Ctrl-C while the second batch is written
    out.close()
    assert (out.batches, out.trajectories) == (1, 8)
    assert path.read_text() == (tmp_path / "a.jsonl").read_text()


def test_the_progress_bar_advances_over_every_batch() -> None:
    env = {**os.environ, "FORCE_COLOR": "1", "COLUMNS": "120"}
    proc = subprocess.run([sys.executable, "-m", "turnpool.cli", "rollout", *LAKE,
                           "--batches", "3"], capture_output=True, text=True, env=env,
                          timeout=100, check=False)
    assert proc.returncode == 0, proc.stderr
    shown = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", proc.stderr)
    assert "batch 1/3" in shown and "batch 3/3" in shown
    assert "15/15 turns" in shown  # 3 batches x max_turn 5


def test_each_batch_of_a_run_has_its_own_group_uids_and_tree_node_ids(tmp_path: Path) -> None:
    def run(batches: int, name: str) -> tuple[list[Any], list[dict[str, Any]]]:
        out, tree = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.tree.jsonl"
        res = CliRunner().invoke(main, ["rollout", "--no-progress", *LAKE,
                                        "turnpool.collector.tree.mode=best_of_n",
                                        "--batches", str(batches), "--out", str(out),
                                        "--tree-out", str(tree)])
        assert res.exit_code == 0, res.output
        return list(read_jsonl(out)), [json.loads(x) for x in tree.read_text().splitlines()]

    one, one_nodes = run(1, "one")
    three, three_nodes = run(3, "three")
    assert len({t.group_uid for t in three}) == 3 * len({t.group_uid for t in one}) == 6
    assert sorted({t.gen_batch for t in three}) == [0, 1, 2]
    assert [t.group_uid for t in three[:len(one)]] == [t.group_uid for t in one]
    ids = [n["node_id"] for n in three_nodes]
    assert len(set(ids)) == len(ids) > len(one_nodes)  # later batches' trees differ in size
    assert len({n["group_uid"] for n in three_nodes}) == 6
    assert all(n["parent_id"] is None or n["parent_id"] in set(ids) for n in three_nodes)
