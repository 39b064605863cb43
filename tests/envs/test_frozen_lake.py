"""FrozenLake: seeded maps with a path, slippery dynamics, rendering, and the oracle."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import turnpool
from turnpool.envs.base import TextEnv
from turnpool.envs.frozen_lake import (
    ACTIONS,
    SUCCESS_RATE,
    FrozenLakeEnv,
    generate_map,
    has_path,
    optimal_policy,
    oracle,
    parse_obs,
)

pytestmark = pytest.mark.timeout(120)


def test_every_generated_map_has_a_path_and_one_start_and_goal() -> None:
    env = FrozenLakeEnv()
    maps = set()
    for seed in range(500):
        obs, info = env.reset(seed=seed)
        desc = env.desc
        assert len(desc) == 4 and all(len(row) == 4 for row in desc)
        flat = "".join(desc)
        assert flat.count("S") == 1 and flat.count("G") == 1
        assert set(flat) <= set("SFHG")
        assert has_path(desc)
        assert obs.count("P") == 1 and obs.count("G") == 1 and set(obs) <= set("P_OG\n")
        assert info["anchor_obs"] == obs
        maps.add(desc)
    assert len(maps) > 450  # seeds give genuinely different maps


def test_generation_parameters() -> None:
    rng = np.random.default_rng(0)
    big = generate_map(rng, size=8, p=0.6)
    assert len(big) == 8 and has_path(big)
    all_frozen = generate_map(np.random.default_rng(1), size=5, p=1.0)
    assert "H" not in "".join(all_frozen)
    with pytest.raises(ValueError):
        generate_map(rng, size=4, p=0.0)
    with pytest.raises(ValueError):
        FrozenLakeEnv(observation_format="pixels")
    with pytest.raises(ValueError):
        FrozenLakeEnv(success_rate=1.5)


def _trajectory(env: TextEnv, seed: int, actions: list[int]) -> list[object]:
    out: list[object] = [env.reset(seed=seed)]
    for a in actions:
        out.append(env.step(a))
    return out


def test_same_seed_same_episode_across_instances() -> None:
    actions = [1, 2, 3, 4, 2, 2, 3, 3, 1, 4] * 2
    for seed in (0, 7, 123456789):
        a = _trajectory(FrozenLakeEnv(), seed, actions)
        b = _trajectory(turnpool.make("frozen_lake"), seed, actions)
        assert a == b


def _open_lake(env: FrozenLakeEnv, seed: int, pos: tuple[int, int]) -> None:
    """Reset with ``seed`` (for the slip draws) and put the player on an all-ice map."""
    env.reset(seed=seed)
    env.desc = ("FFFF", "FFFF", "FFFF", "FFFG")
    env.pos = pos


def test_slippery_moves_go_intended_or_perpendicular_with_equal_odds() -> None:
    env = FrozenLakeEnv(is_slippery=True, success_rate=SUCCESS_RATE)  # gymnasium's odds
    landed: Counter[tuple[int, int]] = Counter()
    for seed in range(900):
        _open_lake(env, seed, (1, 1))
        env.step("Down")
        landed[env.pos] += 1
    assert set(landed) == {(2, 1), (1, 0), (1, 2)}  # down, left, right; never up
    for count in landed.values():
        assert 240 <= count <= 360


def test_non_slippery_moves_are_exact_and_walls_stop_the_player() -> None:
    env = FrozenLakeEnv(is_slippery=False)
    _open_lake(env, 0, (0, 0))
    _, reward, terminated, _, info = env.step("Up")
    assert env.pos == (0, 0) and not info["action_is_effective"] and info["action_is_valid"]
    assert (reward, terminated) == (0.0, False)
    env.step("right")
    assert env.pos == (0, 1)
    env.step(2)
    assert env.pos == (1, 1)
    for action, pos in ((1, (1, 0)), (4, (0, 0))):
        _, _, _, _, info = env.step(action)
        assert env.pos == pos and info["action_is_effective"]


def test_goal_and_hole_end_the_episode_with_their_symbols() -> None:
    env = FrozenLakeEnv(is_slippery=False)
    _open_lake(env, 0, (3, 2))
    obs, reward, terminated, truncated, info = env.step("Right")
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
    assert obs.splitlines()[3] == "___√"
    # Further actions change nothing.
    assert env.step("Left")[1:3] == (0.0, True) and env.pos == (3, 3)

    _open_lake(env, 0, (0, 0))
    env.desc = ("FHFF", "FFFF", "FFFF", "FFFG")
    obs, reward, terminated, _, info = env.step("Right")
    assert (reward, terminated, info["success"]) == (0.0, True, False)
    assert obs.splitlines()[0] == "_X__"


def test_invalid_actions_change_nothing() -> None:
    env = FrozenLakeEnv()
    obs, _ = env.reset(seed=3)
    before = env.get_state()
    for bad in ("Jump", "", 0, 5, None, 2.5):
        obs2, reward, terminated, _, info = env.step(bad)
        assert (obs2, reward, terminated, info["action_is_valid"]) == (obs, 0.0, False, False)
    after = env.get_state()
    assert after["pos"] == before["pos"] and after["__rng__"] == before["__rng__"]


def test_state_snapshot_restores_the_episode_including_slips() -> None:
    a, b = FrozenLakeEnv(), FrozenLakeEnv()
    a.reset(seed=42)
    b.set_state(a.get_state())
    for action in (2, 3, 3, 2, 1, 4, 2, 3):
        assert a.step(action) == b.step(action)


def test_value_iteration_policy() -> None:
    desc = ("SFFF", "FHFH", "FFFH", "HFFG")
    policy, values = optimal_policy(desc, True)
    assert policy.shape == values.shape == (4, 4)
    assert values[1, 1] == values[3, 3] == 0.0  # terminal cells
    assert np.all((values >= 0) & (values <= 1))
    assert values[2, 2] > values[0, 0]  # closer to the goal is worth more
    # Bellman optimality, checked with a separate transition model written out here.
    moves = {1: (0, -1), 2: (1, 0), 3: (0, 1), 4: (-1, 0)}
    sideways = {1: (2, 4), 2: (1, 3), 3: (2, 4), 4: (1, 3)}
    for r in range(4):
        for c in range(4):
            if desc[r][c] in "HG":
                continue
            q = {}
            for a in moves:
                total = 0.0
                for m in (a, *sideways[a]):
                    r2 = min(max(r + moves[m][0], 0), 3)
                    c2 = min(max(c + moves[m][1], 0), 3)
                    total += ((desc[r2][c2] == "G") + 0.95 * values[r2, c2]) / 3
                q[a] = total
            assert values[r, c] == pytest.approx(max(q.values()), abs=1e-8)
            assert q[int(policy[r, c])] == pytest.approx(max(q.values()), abs=1e-8)
    straight, _ = optimal_policy(desc, False)
    assert ACTIONS[int(straight[3, 2])] == "Right"
    assert ACTIONS[int(straight[2, 2])] == "Down"


def _success_rate(policy: str, slippery: bool, seeds: range, budget: int = 100) -> float:
    env = FrozenLakeEnv(is_slippery=slippery)
    rng = np.random.default_rng(0)
    successes = 0
    for seed in seeds:
        obs, info = env.reset(seed=seed)
        steps = 0
        terminated = False
        while steps < budget and not terminated:
            names = (oracle(obs, {"is_slippery": slippery}) if policy == "oracle"
                     else [ACTIONS[int(rng.integers(1, 5))]])
            assert names
            for name in names:
                obs, _, terminated, _, info = env.step(name)
                steps += 1
                if terminated:
                    break
        successes += bool(info["success"])
    return successes / len(seeds)


def test_oracle_always_reaches_the_goal_without_slipping() -> None:
    env = FrozenLakeEnv(is_slippery=False)
    obs, _ = env.reset(seed=5)
    path = oracle(obs, {"is_slippery": False})
    assert len(path) >= 1 and set(path) <= set(ACTIONS.values())
    assert _success_rate("oracle", False, range(200)) == 1.0


def test_oracle_beats_random_on_slippery_ice() -> None:
    oracle_rate = _success_rate("oracle", True, range(200))
    random_rate = _success_rate("random", True, range(200))
    assert oracle_rate >= 0.75
    assert oracle_rate > random_rate + 0.3


def test_oracle_on_finished_or_foreign_text() -> None:
    assert oracle("__O_\n__G_\n____\n_X_O", {}) == []
    assert oracle("__O_\n__√_\n____\n___O", {}) == []
    assert oracle("Target: 3, nums: [1, 2]", {}) == []
    assert oracle("P" * 20_000, {}) == []
    assert parse_obs("P_\n_G") == (("FF", "FG"), (0, 0), "P")
    assert parse_obs("P_\n_GG") is None


def test_rgb_array() -> None:
    from turnpool.envs.frozen_lake import tiles

    env = FrozenLakeEnv(is_slippery=False, render_mode="rgb_array")
    with pytest.raises(RuntimeError):
        env.render("rgb_array")
    obs, _ = env.reset(seed=3)
    assert env.render("text") == obs
    img = env.render()  # the render_mode it was made with
    assert np.array_equal(img, env.render("rgb_array"))
    assert img.shape == (4 * 16, 4 * 16, 3) and img.dtype == np.uint8
    assert len({t.tobytes() for t in tiles()}) == 6  # every cell kind looks different
    r, c = env.pos
    assert np.array_equal(img[r * 16:(r + 1) * 16, c * 16:(c + 1) * 16], tiles()[3])
    env.step(oracle(obs, {"is_slippery": False})[0])
    moved = env.render("rgb_array")
    assert not np.array_equal(img, moved)  # the frame follows the player
    with pytest.raises(ValueError):
        env.render("human")
