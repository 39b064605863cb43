"""Scripted policies: the random policy's determinism, format and invalid rate; the oracle
policy solving real envs through their module-level oracle functions."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import turnpool
from turnpool.envs.safe_math import evaluate
from turnpool.policies import TurnContext, make_policy, policy_names
from turnpool.policies.oracle import OraclePolicy, find_oracle
from turnpool.policies.random import RandomPolicy
from turnpool.rollout.projection import parse_response
from turnpool.rollout.projection import projection_for as create_projection_function

pytestmark = pytest.mark.timeout(120)

SOKOBAN_NAMES = ["Up", "Down", "Left", "Right"]


def ctx(env_id: int = 0, turn: int = 0, seed: int = 7, **kw: Any) -> TurnContext:
    base: dict[str, Any] = dict(
        env_id=env_id, env_type="sokoban", env_kwargs={}, obs="#####\n#P X#\n#####",
        action_names=SOKOBAN_NAMES, turn=turn, actions_left=10, max_actions_per_turn=3,
        action_sep="||", enable_think=True, seed=seed, tag="SimpleSokoban")
    base.update(kw)
    return TurnContext(**base)


def replies(policy: Any, contexts: list[TurnContext]) -> list[str]:
    return list(policy.generate([[{"role": "user", "content": c.obs}] for c in contexts],
                                contexts))


# ------------------------------------------------------------------------------ factory
def test_make_policy_builds_each_scripted_kind_and_rejects_bad_config() -> None:
    assert {"random", "oracle", "openai", "hf"} <= set(policy_names())
    assert isinstance(make_policy({"name": "random", "invalid_rate": 0.5}), RandomPolicy)
    oracle = make_policy({"name": "oracle", "epsilon": 0.1, "seed": 3})
    assert isinstance(oracle, OraclePolicy) and oracle.epsilon == 0.1
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        make_policy({"name": "nope"})
    with pytest.raises(TypeError, match="random.*bogus"):
        make_policy({"name": "random", "bogus": 1.0})
    # Left over from another kind's config (switching name keeps the other keys): dropped.
    assert isinstance(make_policy({"name": "random", "epsilon": 0.1, "max_tokens": 9}),
                      RandomPolicy)
    with pytest.raises(ValueError, match="invalid_rate"):
        make_policy({"name": "random", "invalid_rate": 1.5})


# ------------------------------------------------------------------------------- random
def test_random_replies_are_well_formed_and_use_only_listed_actions() -> None:
    policy = RandomPolicy(seed=1)
    contexts = [ctx(env_id=i, turn=t) for i in range(50) for t in range(4)]
    counts = set()
    for reply in replies(policy, contexts):
        parsed = parse_response(reply, action_sep="||", max_actions=3, enable_think=True)
        assert parsed.format_valid, reply
        assert set(parsed.actions) <= set(SOKOBAN_NAMES)
        counts.add(len(parsed.actions))
    assert counts == {1, 2, 3}  # 1..max_actions_per_turn actions, all lengths occur


def test_random_respects_budget_and_think_switch() -> None:
    policy = RandomPolicy(seed=2)
    no_think = [ctx(env_id=i, enable_think=False, actions_left=1) for i in range(40)]
    for reply in replies(policy, no_think):
        assert reply.startswith("<answer>") and "<think>" not in reply
        parsed = parse_response(reply, enable_think=False)
        assert parsed.format_valid and len(parsed.actions) == 1  # only one action left
    custom_sep = [ctx(env_id=i, action_sep=",", max_actions_per_turn=2) for i in range(40)]
    assert all(parse_response(r, action_sep=",", max_actions=2).format_valid
               for r in replies(policy, custom_sep))


def test_random_is_deterministic_per_env_and_turn_whatever_the_batch() -> None:
    contexts = [ctx(env_id=i, turn=i % 3, seed=100 + i // 4) for i in range(24)]
    first = replies(RandomPolicy(seed=5, invalid_rate=0.2), contexts)
    again = replies(RandomPolicy(seed=5, invalid_rate=0.2), contexts)
    assert first == again
    shuffled = list(reversed(contexts))
    assert replies(RandomPolicy(seed=5, invalid_rate=0.2), shuffled) == list(reversed(first))
    alone = [replies(RandomPolicy(seed=5, invalid_rate=0.2), [c])[0] for c in contexts[:6]]
    assert alone == first[:6]
    other_seed = replies(RandomPolicy(seed=6, invalid_rate=0.2), contexts)
    assert other_seed != first
    assert len(set(first)) > 5  # replies differ between envs and turns


@pytest.mark.parametrize("rate", [0.0, 0.25, 1.0])
def test_random_invalid_rate_matches_observed_format_failures(rate: float) -> None:
    policy = RandomPolicy(seed=11, invalid_rate=rate)
    contexts = [ctx(env_id=i, turn=t, seed=3) for i in range(1000) for t in range(4)]
    valid = [parse_response(r, action_sep="||", max_actions=3).format_valid
             for r in replies(policy, contexts)]
    observed = 1.0 - sum(valid) / len(valid)
    # 4000 Bernoulli draws: the standard error at 0.25 is 0.007; 0.03 is over four of them.
    assert abs(observed - rate) <= 0.03, observed


def test_random_free_text_envs_get_expressions_or_numbers() -> None:
    policy = RandomPolicy(seed=0)
    countdown = create_projection_function("countdown")
    cds = [ctx(env_id=i, env_type="countdown", obs="Target: 24, nums: [3, 5, 7, 1]",
               action_names=None, max_actions_per_turn=1) for i in range(30)]
    actions = [parse_response(r, max_actions=1).actions[0] for r in replies(policy, cds)]
    _, valids = countdown(actions)
    assert all(valids), actions
    for expr in actions:
        used = sorted(int(tok) for tok in expr.replace("(", " ").replace(")", " ").split()
                      if tok.isdigit())
        assert set(used) <= {1, 3, 5, 7} and len(used) == len(set(used)), expr
    maths = [ctx(env_id=i, env_type="metamathqa", obs="What is 2 + 2?", action_names=None,
                 max_actions_per_turn=1) for i in range(10)]
    for reply in replies(policy, maths):
        assert parse_response(reply, max_actions=1).actions[0].isdigit()


def test_scripted_policies_need_contexts() -> None:
    with pytest.raises(ValueError, match="TurnContext"):
        RandomPolicy().generate([[{"role": "user", "content": "x"}]])
    with pytest.raises(ValueError, match="TurnContext"):
        OraclePolicy().generate([[{"role": "user", "content": "x"}]], [])


# ------------------------------------------------------------------------------- oracle
def run_episode(policy: Any, env_type: str, env_kwargs: dict[str, Any], seed: int,
                env_id: int = 0, max_turns: int = 20, per_turn: int = 1) -> tuple[bool, int]:
    """Drive one env with the policy the way the collector does (minus prompts)."""
    env = turnpool.make(env_type, **env_kwargs)
    obs, info = env.reset(seed=seed)
    steps = 0
    for turn in range(max_turns):
        lookup = env.action_lookup_for_episode()
        context = TurnContext(
            env_id=env_id, env_type=env_type, env_kwargs=env_kwargs, obs=obs,
            action_names=list(lookup.values()) if lookup else None, turn=turn,
            actions_left=100 - steps, max_actions_per_turn=per_turn, action_sep="||",
            enable_think=True, seed=seed, tag=env_type)
        parsed = parse_response(policy.generate([[]], [context])[0], max_actions=per_turn)
        assert parsed.format_valid
        for action in parsed.actions:
            obs, _, terminated, truncated, info = env.step(action)
            steps += 1
            if terminated or truncated:
                return bool(info["success"]), steps
    return bool(info["success"]), steps


def test_find_oracle_resolves_module_level_functions() -> None:
    from turnpool.envs import countdown, frozen_lake, sokoban

    assert find_oracle("sokoban") is sokoban.oracle
    assert find_oracle("countdown") is countdown.oracle
    assert find_oracle("frozen_lake") is frozen_lake.oracle
    with pytest.raises(LookupError, match="no oracle"):
        find_oracle("trivial")


@pytest.mark.parametrize("env_type,env_kwargs,episodes,min_success", [
    ("sokoban", {"dim_room": (6, 6), "num_boxes": 1}, 20, 0.95),
    ("countdown", {}, 40, 0.95),
    ("frozen_lake", {"is_slippery": False}, 30, 0.95),
    ("bandit", {}, 40, 1.0),
    ("metamathqa", {}, 20, 1.0),
])
def test_oracle_solves_envs(env_type: str, env_kwargs: dict[str, Any], episodes: int,
                            min_success: float) -> None:
    policy = OraclePolicy(seed=0)
    wins = [run_episode(policy, env_type, env_kwargs, seed=s, per_turn=3)[0]
            for s in range(episodes)]
    assert sum(wins) / episodes >= min_success


def test_oracle_replies_follow_the_plan_and_epsilon_replaces_actions() -> None:
    from turnpool.envs import frozen_lake

    env = turnpool.make("frozen_lake", size=6, is_slippery=False)
    contexts, plans = [], []
    for seed in range(60):
        obs, _ = env.reset(seed=seed)
        plan = frozen_lake.oracle(obs, {"is_slippery": False})
        if len(plan) < 3:
            continue
        contexts.append(ctx(env_id=seed, env_type="frozen_lake", obs=obs,
                            env_kwargs={"size": 6, "is_slippery": False},
                            action_names=list(frozen_lake.ACTIONS.values()),
                            max_actions_per_turn=3))
        plans.append(plan[:3])
    assert len(contexts) >= 20
    exact = [parse_response(r, max_actions=3).actions for r in replies(OraclePolicy(), contexts)]
    assert exact == plans
    noisy_policy = OraclePolicy(seed=4, epsilon=0.5)
    noisy = [parse_response(r, max_actions=3).actions for r in replies(noisy_policy, contexts)]
    assert noisy == [parse_response(r, max_actions=3).actions
                     for r in replies(OraclePolicy(seed=4, epsilon=0.5), contexts)]
    changed = sum(a != b for got, want in zip(noisy, plans) for a, b in zip(got, want))
    total = sum(len(p) for p in plans)
    # A replaced action equals the planned one 1 time in 4, so about 3/8 of them change.
    assert 0.15 * total <= changed <= 0.6 * total
    assert all(len(got) == len(want) for got, want in zip(noisy, plans))


def test_oracle_failure_still_answers_in_format_and_is_counted() -> None:
    policy = OraclePolicy(seed=0)
    bad = ctx(env_type="countdown", obs="not a puzzle", action_names=None,
              max_actions_per_turn=1)
    reply = replies(policy, [bad])[0]
    assert parse_response(reply, max_actions=1).format_valid  # a random expression instead
    unknown = dataclasses.replace(bad, env_type="trivial")
    assert parse_response(replies(policy, [unknown])[0], max_actions=1).format_valid
    assert policy.stats.failures == 1  # the synthetic env has no oracle


def test_plans_are_cached_per_observation() -> None:
    policy = OraclePolicy(seed=0)
    obs = "Target: 10, nums: [2, 5, 1]"
    contexts = [ctx(env_id=i, env_type="countdown", obs=obs, action_names=None,
                    max_actions_per_turn=1) for i in range(8)]
    out = replies(policy, contexts)
    assert len(set(out)) == 1
    assert len(policy._plans) == 1
    expr = parse_response(out[0], max_actions=1).actions[0]
    result = evaluate(expr)
    assert result.valid and result.value == 10 and sorted(result.numbers) == [1, 2, 5]


def test_an_env_without_an_oracle_is_warned_about_once_not_per_turn(
        caplog: pytest.LogCaptureFixture) -> None:
    policy = OraclePolicy(seed=0)
    contexts = [ctx(env_id=i, turn=t, env_type="trivial", obs=f"board {i}")
                for i in range(6) for t in range(3)]
    with caplog.at_level("WARNING", logger="turnpool.policies.oracle"):
        out = replies(policy, contexts)
    assert len(out) == 18 and all("<answer>" in r for r in out)  # random actions, in format
    warned = [r for r in caplog.records if "oracle for trivial failed" in r.getMessage()]
    assert len(warned) == 1 and policy.stats.failures == 6  # once per board (plans are cached)
