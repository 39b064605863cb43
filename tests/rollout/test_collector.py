"""TrajectoryCollector over a real EnvPool with the scripted policies."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

import pytest

from turnpool.backends import BACKENDS
from turnpool.policies import make_policy
from turnpool.policies.base import Message, Policy, TurnContext
from turnpool.ragen.rollout_manager import collector_from_config
from turnpool.rollout.collector import TrajectoryCollector
from turnpool.rollout.sampling import BudgetExhausted
from turnpool.rollout.settings import CollectorSettings
from turnpool.rollout.trajectory import read_jsonl, step_group_uid

pytestmark = pytest.mark.timeout(120)


def _collector(*overrides: str, policy: Policy | None = None) -> TrajectoryCollector:
    base = ["turnpool.backend=sequential"]
    return collector_from_config(overrides=[*base, *overrides], policy=policy)


def _tags(tags: list[str], n_groups: list[int], group_size: int) -> list[str]:
    return [f"es_manager.train.env_configs.tags=[{','.join(tags)}]",
            f"es_manager.train.env_configs.n_groups=[{','.join(map(str, n_groups))}]",
            f"es_manager.train.env_groups={sum(n_groups)}",
            f"es_manager.train.group_size={group_size}"]


class Recording:
    """A real policy, plus a record of which env ids it was asked about at each call."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.calls: list[list[int]] = []

    def generate(self, batch: list[list[Message]],
                 contexts: list[TurnContext] | None = None) -> list[str]:
        assert contexts is not None
        self.calls.append([c.env_id for c in contexts])
        return self.inner.generate(batch, contexts)

    def close(self) -> None:
        self.inner.close()


def test_finished_envs_are_neither_generated_for_nor_stepped() -> None:
    rec = Recording(make_policy({"name": "oracle", "epsilon": 0.3, "seed": 1}))
    with _collector(*_tags(["FrozenLake", "Bandit"], [2, 2], 4), "agent_proxy.max_turn=6",
                    policy=rec) as col:
        batch = col.collect()
    asked = Counter(i for call in rec.calls for i in call)
    for t in batch.trajectories:
        # one generation per recorded turn, none after the episode ended
        assert asked[t.env_id] == len(t.turns)
        if t.tag == "Bandit":
            assert len(t.turns) == 1 and t.end_reason == "terminated"
        assert t.end_reason in ("terminated", "truncated", "action_budget", "max_turn")
    later = set(rec.calls[1])
    assert not any(t.env_id in later for t in batch.trajectories if t.tag == "Bandit")
    assert 1 < len(rec.calls) <= 6 and len(rec.calls[0]) == 16  # max_turn bounds the calls
    # env steps counted only for what ran
    assert batch.metrics["env_steps"] == sum(t.num_actions for t in batch.trajectories)


def test_trajectory_records_and_jsonl_round_trip(tmp_path: Path) -> None:
    with _collector(*_tags(["FrozenLake"], [2], 3), "turnpool.policy.name=random",
                    "turnpool.policy.random.invalid_rate=0.3") as col:
        batch = col.collect(seed=5)
    t = batch.trajectories[4]
    assert (t.group_id, t.tag, t.env_type, t.seed) == (1, "FrozenLake", "frozen_lake", 6)
    assert t.messages[0]["role"] == "system" and t.messages[-1]["role"] == "assistant"
    assert sum(m["role"] == "assistant" for m in t.messages) == len(t.turns)
    assert t.rewards == [turn.reward for turn in t.turns]
    assert t.penalty == pytest.approx(-0.1 * sum(turn.penalized for turn in t.turns))
    path = tmp_path / "t.jsonl"
    assert batch.to_jsonl(path) == 6
    assert list(read_jsonl(path)) == batch.trajectories
    buf = io.StringIO()
    batch.to_jsonl(buf)
    assert buf.getvalue() == path.read_text(encoding="utf-8")


def _equivalence_backends() -> list[str]:
    return [b for b in ("sequential", "thread", "process", "process_pool") if b in BACKENDS]


def test_same_config_and_seed_give_identical_jsonl_on_every_backend(tmp_path: Path) -> None:
    overrides = [*_tags(["SimpleSokoban", "FrozenLake", "Bandit", "Countdown"], [1, 2, 1, 1], 3),
                 "turnpool.policy.name=random", "turnpool.policy.random.invalid_rate=0.2",
                 "turnpool.num_workers=2", "turnpool.fallback=false",
                 "agent_proxy.reward_normalization.method=mean_std"]
    outputs = {}
    for backend in _equivalence_backends():
        with collector_from_config(
                overrides=[*overrides, f"turnpool.backend={backend}"]) as col:
            assert col.pool.backend_name == backend
            first = col.collect()
            second = col.collect()
        buf = io.StringIO()
        first.to_jsonl(buf)
        second.to_jsonl(buf)
        outputs[backend] = buf.getvalue()
    assert len(outputs) >= 3
    ref = outputs["sequential"]
    assert len(ref.splitlines()) == 2 * 15
    for backend, text in outputs.items():
        assert text == ref, backend
    assert ref.splitlines()[0] != ref.splitlines()[15]  # the second batch has new seeds


def test_seed_scheme_train_blocks_and_constant_val() -> None:
    with _collector(*_tags(["Bandit"], [3], 2)) as col:
        seeds = [sorted({t.seed for t in col.collect().trajectories}) for _ in range(2)]
        assert seeds == [[10000, 10001, 10002], [10003, 10004, 10005]]
        col.collect(seed=50)
        # an explicit seed moves past its whole block (RAGEN reused seed+1 .. seed+2)
        assert sorted({t.seed for t in col.collect().trajectories}) == [53, 54, 55]
    with collector_from_config(overrides=[
            "turnpool.backend=sequential", "es_manager.val.env_groups=2",
            "es_manager.val.env_configs.tags=[Bandit]", "es_manager.val.env_configs.n_groups=[2]"],
            mode="val") as col:
        a, b = col.collect(), col.collect()
        assert {t.seed for t in a.trajectories} == {t.seed for t in b.trajectories} == {123, 124}


def test_dynamic_sampling_returns_exactly_the_target_and_reports_counts() -> None:
    ov = [*_tags(["FrozenLake"], [2], 4), "algorithm.filter_groups.enable=true",
          "algorithm.filter_groups.max_num_gen_batches=30", "turnpool.collector.target_groups=3",
          "turnpool.policy.oracle.epsilon=0.5", "agent_proxy.max_turn=3"]
    with _collector(*ov) as col:
        batch = col.collect()
    m = batch.metrics
    groups: dict[str, list[float]] = {}
    for t in batch.trajectories:
        groups.setdefault(t.group_uid, []).append(t.score)
    assert len(groups) == 3 and len(batch.trajectories) == 12
    assert all(len(set(scores)) > 1 for scores in groups.values())
    assert m["dynamic/kept_groups"] == 3 and m["dynamic/returned_groups"] == 3
    assert m["dynamic/gen_batches"] >= 2
    seen = 2 * m["dynamic/gen_batches"]
    assert m["dynamic/dropped_groups"] + m["dynamic/surplus_groups"] + 3 == seen
    assert m["FrozenLake/trajectories"] == 12


@pytest.mark.parametrize("policy", ["raise", "keep_all", "return_short"])
def test_dynamic_sampling_budget_exhausted(policy: str) -> None:
    # the oracle always solves countdown: every group is constant and gets dropped
    ov = [*_tags(["Countdown"], [2], 2), "algorithm.filter_groups.enable=true",
          "algorithm.filter_groups.max_num_gen_batches=2", "turnpool.policy.oracle.epsilon=0",
          "agent_proxy.max_turn=1", f"turnpool.collector.on_budget_exhausted={policy}"]
    with _collector(*ov) as col:
        if policy == "raise":
            with pytest.raises(BudgetExhausted, match="0 of 2 groups after 2"):
                col.collect()
            return
        batch = col.collect()
    m = batch.metrics
    assert m["dynamic/gen_batches"] == 2 and m["dynamic/dropped_groups"] == 4
    assert m["dynamic/kept_groups"] == 0
    if policy == "keep_all":
        assert m["dynamic/filled_groups"] == 2 and len(batch.trajectories) == 4
        assert {t.gen_batch for t in batch.trajectories} == {0}
    else:
        assert m["dynamic/returned_groups"] == 0 and batch.trajectories == []


def test_oracle_solves_countdown() -> None:
    with _collector(*_tags(["Countdown"], [16], 4), "agent_proxy.max_turn=1",
                    "turnpool.policy.oracle.epsilon=0") as col:
        m = col.collect().metrics
    assert m["Countdown/success"] >= 0.95
    assert m["Countdown/penalty_rate"] == 0.0


def test_oracle_solves_sokoban_6x6_one_box() -> None:
    with _collector(*_tags(["SimpleSokoban"], [16], 2), "agent_proxy.max_turn=10",
                    "turnpool.policy.oracle.epsilon=0") as col:
        m = col.collect().metrics
    assert m["SimpleSokoban/success"] >= 0.9  # RAGEN's rooms: a few need more than 10 moves


def test_random_policy_penalties_match_its_invalid_rate() -> None:
    with _collector(*_tags(["FrozenLake"], [32], 16), "turnpool.policy.name=random",
                    "turnpool.policy.random.invalid_rate=0.3", "agent_proxy.max_turn=10") as col:
        batch = col.collect()
    turns = [turn for t in batch.trajectories for turn in t.turns]
    assert len(turns) > 1200
    # FrozenLake accepts every well-formed random answer: a turn is penalized exactly when
    # the reply was malformed, and each costs -0.1 once
    assert all(turn.penalized == (not turn.format_valid) for turn in turns)
    rate = batch.metrics["FrozenLake/penalty_rate"]
    assert abs(rate - 0.3) < 0.05  # ~4 standard deviations at this many turns
    total = sum(t.penalty for t in batch.trajectories)
    assert total == pytest.approx(-0.1 * sum(turn.penalized for turn in turns))


def test_normalized_scores_and_gigpo_step_groups() -> None:
    with _collector(*_tags(["FrozenLake"], [3], 4), "turnpool.policy.oracle.epsilon=0.5",
                    "agent_proxy.reward_normalization.method=mean") as col:
        batch = col.collect()
    by_group: dict[str, list[float]] = {}
    for t in batch.trajectories:
        by_group.setdefault(t.group_uid, []).append(t.normalized_score)
        assert t.normalized_score == pytest.approx(
            t.score + t.penalty - sum(x.score + x.penalty for x in batch.trajectories
                                      if x.group_uid == t.group_uid) / 4)
    for scores in by_group.values():
        assert sum(scores) == pytest.approx(0.0, abs=1e-9)
    # members of a group start in the same state: one step group at turn 1
    for uid in by_group:
        firsts = {t.turns[0].step_group_uid for t in batch.trajectories if t.group_uid == uid}
        assert len(firsts) == 1
    all_uids = {turn.step_group_uid for t in batch.trajectories for turn in t.turns}
    for t in batch.trajectories:
        for turn in t.turns:
            assert turn.step_group_uid == step_group_uid(t.group_uid, turn.anchor_obs)
    assert len({u.split("/")[0] for u in all_uids}) == 3


def test_metrics_per_tag() -> None:
    with _collector(*_tags(["FrozenLake", "Bandit"], [2, 2], 4)) as col:
        m = col.collect().metrics
    for tag in ("FrozenLake", "Bandit"):
        for key in ("success", "pass@4", "valid_action_ratio", "num_actions", "penalty_rate",
                    "errors", "trajectories"):
            assert f"{tag}/{key}" in m
        assert m[f"{tag}/pass@4"] >= m[f"{tag}/success"]
    for key in ("timing/env_s", "timing/policy_s", "timing/env_ms_per_turn", "env_steps",
                "env_steps_per_s"):
        assert m[key] >= 0.0


# ------------------------------------------------------------------ real language models
LLM_ROLLOUT = [*_tags(["FrozenLake", "Bandit"], [2, 1], 2), "agent_proxy.max_turn=2"]


def _check_llm_batch(batch: object, policy: Policy) -> None:
    trajs = batch.trajectories  # type: ignore[attr-defined]
    assert len(trajs) == 6 and batch.metrics["errors"] == 0  # type: ignore[attr-defined]
    turns = [turn for t in trajs for turn in t.turns]
    assert all(turn.llm_raw_response for turn in turns)  # the model's own text
    for turn in turns:  # whatever the model wrote, the manager's rules hold
        assert turn.penalized == (not turn.format_valid or turn.n_valid < len(turn.actions)
                                  or not turn.actions)
    stats = policy.stats  # type: ignore[attr-defined]
    assert stats.failures == 0 and stats.requests == len(turns)


@pytest.mark.timeout(300)
def test_full_rollout_with_a_local_hf_model(tiny_model_dir: Path) -> None:
    policy = make_policy({"name": "hf", "model_path": str(tiny_model_dir),
                          "max_new_tokens": 48})
    with _collector(*LLM_ROLLOUT, policy=policy) as col:
        batch = col.collect()
    policy.close()
    _check_llm_batch(batch, policy)


@pytest.mark.timeout(300)
def test_full_rollout_through_transformers_serve(tiny_model_dir: Path) -> None:
    from turnpool.policies.tiny_llm import transformers_server

    with transformers_server(tiny_model_dir) as base_url:
        policy = make_policy({"name": "openai", "base_url": base_url, "max_tokens": 48,
                              "temperature": 0.0, "concurrency": 4, "timeout": 60})
        try:
            with _collector(*LLM_ROLLOUT, policy=policy) as col:
                batch = col.collect()
        finally:
            policy.close()
    _check_llm_batch(batch, policy)


class Saboteur:
    """Tells env 1 to raise and the others to take a normal step."""

    def generate(self, batch: list[list[Message]],
                 contexts: list[TurnContext] | None = None) -> list[str]:
        assert contexts is not None
        return [f"<think></think><answer>{'raise' if c.env_id == 1 else 'go'}</answer>"
                for c in contexts]

    def close(self) -> None:
        pass


def test_an_env_error_ends_only_that_episode_and_is_reported() -> None:
    from turnpool.pool import EnvPool

    with EnvPool("faulty", env_num=2, group_n=2, seed=3, backend="process", num_workers=2,
                 step_timeout=30.0) as pool:
        col = TrajectoryCollector(pool, Saboteur(), settings=CollectorSettings(max_turn=3))
        batch = col.collect()
    # The failed episode is never a reward-0 sample: its group (envs 0 and 1) is dropped
    # (an env error is not retryable) and the failure is counted by class.
    by_id = {t.env_id: t for t in batch.trajectories}
    assert sorted(by_id) == [2, 3]
    assert all(by_id[i].error is None and len(by_id[i].turns) == 3 for i in (2, 3))
    assert batch.metrics["failures/env_error"] == 1 and batch.metrics["errors"] == 0
    assert batch.metrics["failures/dropped_groups"] == 1


def test_first_gen_batch_numbers_a_run_of_collect_calls_on() -> None:
    with _collector(*_tags(["FrozenLake"], [2], 2), "agent_proxy.max_turn=1") as col:
        first = col.collect(seed=5)
        plain = col.collect(seed=5)  # the default: every call the same for the same seed
        assert col.gen_batches == 2
        later = col.collect(seed=5, first_gen_batch=col.gen_batches)
    uids = [t.group_uid for t in first.trajectories]
    assert uids == [t.group_uid for t in plain.trajectories] == ["0-0", "0-0", "0-1", "0-1"]
    assert [t.group_uid for t in later.trajectories] == ["2-0", "2-0", "2-1", "2-1"]
    assert {t.gen_batch for t in later.trajectories} == {2}
