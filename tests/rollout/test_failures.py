"""A failed episode is never a reward-0 sample: it is played again from its seed (bounded) or
its group is dropped, and every failure is counted by class."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.faults import ALL_FAULTS_ENV
from turnpool.policies.base import FailedReply, Message, TurnContext
from turnpool.pool import EnvPool
from turnpool.rollout.collector import TrajectoryCollector
from turnpool.rollout.settings import CollectorSettings, TagSpec, TurnSettings

pytestmark = pytest.mark.timeout(120)


class Scripted:
    """Answers "go" (or the action of ``faults``: env id -> (action, how many times))."""

    def __init__(self, faults: dict[int, tuple[str, int]] | None = None) -> None:
        self.faults = dict(faults or {})
        self.used: Counter[int] = Counter()

    def generate(self, batch: list[list[Message]],
                 contexts: list[TurnContext] | None = None) -> list[str]:
        assert contexts is not None
        out: list[str] = []
        for c in contexts:
            action, times = self.faults.get(c.env_id, ("go", 0))
            if self.used[c.env_id] < times:
                self.used[c.env_id] += 1
                out.append(FailedReply("server said no") if action == "fail"
                           else f"<answer>{action}</answer>")
            else:
                out.append(f"<answer>go{c.turn}</answer>")
        return out

    def close(self) -> None:
        pass


def _collect(policy: Scripted, backend: str = "sequential", retries: int = 2
             ) -> tuple[list[dict[str, object]], dict[str, float]]:
    pool = EnvPool(ALL_FAULTS_ENV, env_num=2, group_n=2, seed=0, backend=backend,
                   num_workers=2, step_timeout=1.0, tag="Faulty")
    tags = [TagSpec("Faulty", ALL_FAULTS_ENV, n_groups=2, max_actions_per_traj=10)]
    settings = CollectorSettings(max_turn=3, turn=TurnSettings(enable_think=False),
                                 episode_retries=retries, seed_base=100)
    with TrajectoryCollector(pool, policy, tags, settings, owns_pool=True) as col:
        batch = col.collect()
    return [t.to_dict() for t in batch.trajectories], batch.metrics


@pytest.mark.parametrize(("backend", "fault", "failure"), [
    ("sequential", "hang", "timeout"), ("process", "exit", "worker_lost"),
    ("thread", "fail", "policy_error")])
def test_a_retryable_failure_is_played_again_from_the_same_seed(
        backend: str, fault: str, failure: str) -> None:
    clean, _ = _collect(Scripted())
    got, metrics = _collect(Scripted({1: (fault, 1)}), backend)
    assert got == clean  # the retried episode is the clean one: no reward-0 sample
    assert metrics[f"failures/{failure}"] == 1 and metrics["failures/retried"] == 1
    assert metrics["failures/dropped_groups"] == 0
    assert metrics["failures/unrecovered_fraction"] == 0.0


def test_a_failure_that_retries_cannot_fix_drops_its_group() -> None:
    clean, _ = _collect(Scripted())
    got, metrics = _collect(Scripted({1: ("raise", 99)}))  # env_error: not retryable
    assert got == [t for t in clean if t["group_id"] == 1]
    assert metrics["failures/env_error"] == 1 and metrics["failures/retried"] == 0
    assert metrics["failures/dropped_groups"] == 1
    assert metrics["failures/unrecovered_fraction"] == 0.25
    got, metrics = _collect(Scripted({2: ("fail", 99)}), retries=2)  # retried, in vain
    assert got == [t for t in clean if t["group_id"] == 0]
    assert metrics["failures/policy_error"] == 3 and metrics["failures/retried"] == 2
    assert metrics["failures/dropped_groups"] == 1 and metrics["trajectories"] == 2


def test_retries_are_configurable_and_validated() -> None:
    got, metrics = _collect(Scripted({1: ("hang", 1)}), retries=0)
    assert metrics["failures/timeout"] == 1 and metrics["failures/retried"] == 0
    assert {t["group_id"] for t in got} == {1}
    with pytest.raises(ValueError, match="episode_retries"):
        CollectorSettings(episode_retries=-1)
    with pytest.raises(ValueError, match="max_turn"):
        CollectorSettings(max_turn=0)
