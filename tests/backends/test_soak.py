"""``turnpool bench soak`` at a small size: faults of every kind at volume, 0 lost
transitions, every fault classified, innocent envs identical to a clean run (ray: in
tests/backends/test_ray; joblib-loky's known limit is in docs/reliability.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from turnpool.bench.soak import FAULTS, Settings, faults_for, schedule
from turnpool.cli import main

pytestmark = pytest.mark.timeout(300)


def test_the_schedule_is_deterministic_and_mixes_the_faults() -> None:
    s = Settings(steps=4000, fault_rate=0.05)
    plan = schedule(s, faults_for("process"))
    assert plan == schedule(s, faults_for("process"))
    kinds = [f for row in plan for _, f in row if f]
    assert set(kinds) == set(FAULTS) and 200 < len(kinds) < 800
    assert set(faults_for("thread")) == {"raise", "hang"}


@pytest.mark.slow(seconds=15)
def test_soak_command_passes_on_every_backend(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    res = CliRunner().invoke(main, ["bench", "soak", "--steps", "800", "--fault-rate", "0.03",
                                    "--backends", "process,thread", "--step-timeout",
                                    "0.5", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "all checks passed" in res.output
    report = json.loads(out.read_text())
    by_backend = {r["backend"]: r for r in report["results"]}
    assert set(by_backend) == {"process", "thread"}
    for r in by_backend.values():
        assert r["ok"] and r["transitions_returned"] == r["transitions_requested"] >= 800
        assert r["innocent_mismatches"] == 0 and r["hangs"] == 0 and r["misclassified"] == 0
        assert sum(r["faults"].values()) == sum(r["classified"].values()) > 0
        assert r["innocent_checked"] > 600
    assert set(by_backend["process"]["faults"]) == set(FAULTS)
