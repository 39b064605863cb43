"""Recording through the collector API and `turnpool.rollout.replay`: failed and retried
attempts are recorded and replayed as far as they are the env's, an env built otherwise than
recorded diverges at its reset, and a pool that a file cannot describe is refused."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from tests.faults import ALL_FAULTS_ENV
from tests.rollout.test_failures import Scripted
from turnpool.envs.synthetic import TrivialEnv
from turnpool.policies import make_policy
from turnpool.pool import EnvPool
from turnpool.rollout.collector import TrajectoryCollector
from turnpool.rollout.record import Recorder, open_for_writing, read_record
from turnpool.rollout.replay import replay
from turnpool.rollout.settings import CollectorSettings, TagSpec, TurnSettings

pytestmark = pytest.mark.timeout(120)


def _record(path: Path, policy: Scripted, mode: str = "lockstep") -> dict[str, float]:
    pool = EnvPool(ALL_FAULTS_ENV, env_num=2, group_n=2, seed=0, backend="sequential",
                   step_timeout=1.0, tag="Faulty")
    tags = [TagSpec("Faulty", ALL_FAULTS_ENV, n_groups=2, max_actions_per_traj=10)]
    settings = CollectorSettings(max_turn=3, turn=TurnSettings(enable_think=False),
                                 episode_retries=1, seed_base=100, collector_mode=mode)
    with TrajectoryCollector(pool, policy, tags, settings, owns_pool=True) as col, \
            open_for_writing(path) as fh:
        col.record_to(Recorder(fh, col.record_header("test")))
        metrics = col.collect().metrics
    return metrics


@pytest.mark.parametrize("mode", ["lockstep", "async"])
def test_failed_and_retried_attempts_are_recorded_and_replayed(tmp_path: Path,
                                                               mode: str) -> None:
    """Env 1 hangs once (a timeout: retried from its seed), env 2 raises (env_error: not
    retried). Every attempt has its line; the raise replays (it is the env's), the timeout
    is the run's and is counted as not compared."""
    path = tmp_path / "faults.jsonl"
    metrics = _record(path, Scripted({1: ("hang", 1), 2: ("raise", 1)}), mode)
    assert metrics["failures/timeout"] == 1 and metrics["failures/env_error"] == 1
    header, episodes = read_record(path)
    lines = list(episodes)
    assert header.collector_mode == mode and header.specs[0].env_type == ALL_FAULTS_ENV
    assert [(r.env_id, r.episode) for r in lines] == [(0, 0), (1, 1), (2, 2), (3, 3), (1, 4)]
    hung, raised, retry = lines[1], lines[2], lines[4]
    assert json.loads(path.read_text().splitlines()[5])["attempt"] == 1
    assert hung.steps[-1]["failure"] == "timeout" and hung.steps[-1]["actions"] == ["hang"]
    assert raised.steps[-1]["failure"] == "env_error" and "raise" in raised.steps[-1]["error"]
    assert retry.seed == hung.seed and not any(s["error"] for s in retry.steps)
    report = replay(path)
    assert report.ok and report.episodes == 5 and report.not_compared == 1
    steps = sum(len(r.steps) for r in lines)
    assert report.transitions == 5 + steps - 1


def test_an_env_built_otherwise_diverges_at_its_reset(tmp_path: Path) -> None:
    pool = EnvPool("frozen_lake", env_num=2, group_n=2, seed=0, backend="sequential",
                   env_kwargs={"size": 4}, tag="Lake")
    tags = [TagSpec("Lake", "frozen_lake", n_groups=2, env_kwargs={"size": 4})]
    path = tmp_path / "lake.jsonl"
    with TrajectoryCollector(pool, make_policy({"name": "random"}), tags,
                             CollectorSettings(max_turn=3), owns_pool=True) as col, \
            open_for_writing(path) as fh:
        col.record_to(Recorder(fh, col.record_header("test")))
        col.collect()
    assert replay(path).ok
    lines = path.read_text().splitlines()
    header: dict[str, Any] = json.loads(lines[0])
    header["specs"][0]["env_kwargs"]["size"] = 5
    path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    report = replay(path)
    assert not report.ok and report.divergent == 4
    first = report.first
    assert first is not None and (first.episode, first.turn, first.field) == (0, None, "obs")
    assert "reset: obs recorded" in first.describe()


def test_a_pool_of_factories_cannot_be_recorded() -> None:
    pool = EnvPool(TrivialEnv, env_num=1, group_n=1, backend="sequential", tag="t")
    tags = [TagSpec("t", "trivial")]
    with TrajectoryCollector(pool, make_policy({"name": "random"}), tags,
                             owns_pool=True) as col, pytest.raises(ValueError, match="factory"):
        col.record_to(Recorder(io.StringIO(), col.record_header("test")))
