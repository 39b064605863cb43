"""Bandit: seeded arm order, case-insensitive arm names, payouts, one-step episodes."""

from __future__ import annotations

import pytest

import turnpool
from turnpool.envs.bandit import BanditEnv, oracle

pytestmark = pytest.mark.timeout(60)


def test_arm_order_depends_on_the_seed_and_both_orders_occur() -> None:
    env = BanditEnv()
    orders = {}
    for seed in range(60):
        obs, info = env.reset(seed=seed)
        lookup = env.action_lookup_for_episode()
        assert set(lookup) == {1, 2} and set(lookup.values()) == {"phoenix", "dragon"}
        # The prompt names the arms in id order.
        assert obs.index(lookup[1]) < obs.index(lookup[2])
        assert info["anchor_obs"] == obs
        orders[seed] = lookup[1]
    assert set(orders.values()) == {"phoenix", "dragon"}
    other = turnpool.make("bandit")
    for seed, first in orders.items():
        other.reset(seed=seed)
        other_lookup = other.action_lookup_for_episode()
        assert other_lookup is not None and other_lookup[1] == first


@pytest.mark.parametrize("answer", ["dragon", "Dragon", "  DRAGON "])
def test_arm_names_match_case_insensitively(answer: str) -> None:
    env = BanditEnv()
    env.reset(seed=1)
    obs, reward, terminated, truncated, info = env.step(answer)
    assert terminated and not truncated
    assert info["success"] and info["action_is_valid"] and info["action_is_effective"]
    assert obs == f"dragon: {reward} points" and reward in (0.0, 1.0)


def test_ids_follow_the_episode_lookup() -> None:
    env = BanditEnv()
    for seed in range(10):
        env.reset(seed=seed)
        lookup = env.action_lookup_for_episode()
        hi_id = next(i for i, name in lookup.items() if name == "dragon")
        assert env.step(hi_id)[4]["success"]


def test_payouts() -> None:
    env = BanditEnv()
    hi_rewards = []
    for seed in range(400):
        env.reset(seed=seed)
        assert env.step("phoenix")[1] == pytest.approx(0.1)
        env.reset(seed=seed)
        hi_rewards.append(env.step("dragon")[1])
    assert set(hi_rewards) == {0.0, 1.0}
    assert 0.18 <= sum(hi_rewards) / len(hi_rewards) <= 0.32


def test_same_seed_same_payout_across_instances() -> None:
    a, b = BanditEnv(), BanditEnv()
    for seed in range(30):
        assert a.reset(seed=seed) == b.reset(seed=seed)
        assert a.step("dragon") == b.step("dragon")


def test_invalid_choice_ends_the_episode_with_nothing() -> None:
    env = BanditEnv()
    env.reset(seed=0)
    obs, reward, terminated, _, info = env.step("tiger")
    assert (reward, terminated, info["action_is_valid"], info["success"]) == (0.0, True, False,
                                                                             False)
    assert "phoenix" in obs and "dragon" in obs
    env.reset(seed=0)
    env.step("phoenix")
    assert env.step("dragon")[1:3] == (0.0, True)  # one pull per episode


def test_custom_arms_and_oracle() -> None:
    env = BanditEnv(lo_arm_name="Teacher", hi_arm_name="Trader", action_space_start=0)
    obs, _ = env.reset(seed=2)
    assert set(env.action_lookup_for_episode()) == {0, 1}
    assert "Teacher" in obs and "Trader" in obs
    assert oracle(obs, {}) == ["dragon"]
    assert oracle(obs, {"lo_arm_name": "Teacher", "hi_arm_name": "Trader"}) == ["Trader"]
    # When the "high" arm's mean falls below the safe arm, the oracle takes the safe arm.
    assert oracle(obs, {"hi_arm_hiscore_prob": 0.05}) == ["phoenix"]
    with pytest.raises(ValueError):
        BanditEnv(lo_arm_name="same", hi_arm_name="SAME")
