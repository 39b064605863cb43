"""RAGEN's reward normalization, each formula checked against a hand computation."""

from __future__ import annotations

import math

import pytest

from turnpool.rollout.scoring import compute_scores, group_keys, normalize

pytestmark = pytest.mark.timeout(30)

EPS = 1e-6


def test_mean_std_formula_by_hand() -> None:
    xs = [1.0, 2.0, 3.0, 6.0]
    # mean 3; unbiased variance (4 + 1 + 0 + 9) / 3 = 14/3
    sd = math.sqrt(14 / 3)
    expected = [(x - 3.0) / (sd + EPS) for x in xs]
    got = normalize(xs + [7.0, 7.0], [0, 0, 0, 0, 1, 1], "mean_std")
    assert got[:4] == pytest.approx(expected, abs=1e-12)
    assert got[4:] == [0.0, 0.0]  # constant group


def test_mean_std_guard_zeroes_groups_with_tiny_spread() -> None:
    # std of [1, 1 + 1e-7] is ~7e-8 <= 1e-6: RAGEN returns zeros, not a huge z-score
    got = normalize([1.0, 1.0 + 1e-7, 0.0, 4.0], ["a", "a", "b", "b"], "mean_std")
    assert got[:2] == [0.0, 0.0]
    sd = math.sqrt(((0 - 2) ** 2 + (4 - 2) ** 2) / 1)
    assert got[2:] == pytest.approx([-2 / (sd + EPS), 2 / (sd + EPS)], abs=1e-12)


def test_mean_formula_by_hand() -> None:
    got = normalize([1.0, 2.0, 6.0, 10.0, 20.0], [0, 0, 0, 1, 1], "mean")
    assert got == pytest.approx([-2.0, -1.0, 3.0, -5.0, 5.0])


def test_asym_clip_clamps_to_minus_one_and_three() -> None:
    xs = [0.0] * 20 + [10.0]  # one outlier: z = (10 - m) / s is far above 3
    m = 10 / 21
    s = math.sqrt((20 * m**2 + (10 - m) ** 2) / 20)
    z = [(x - m) / (s + EPS) for x in xs]
    assert z[-1] > 3
    got = normalize(xs, [0] * 21, "asym_clip")
    assert got[-1] == 3.0
    assert got[:20] == pytest.approx(z[:20])
    lows = [0.0] + [10.0] * 20  # one low outlier: z far below -1
    got = normalize(lows, [0] * 21, "asym_clip")
    assert got[0] == -1.0
    assert all(-1.0 <= v <= 3.0 for v in got)


def test_identity_and_singleton_rule() -> None:
    xs = [3.0, -1.0, 2.0]
    assert normalize(xs, [0, 0, 1], "identity") == xs
    # as many groups as trajectories: nothing is normalized, whatever the method
    for method in ("mean_std", "mean", "asym_clip"):
        assert normalize(xs, [0, 1, 2], method) == xs
    # a singleton group inside a larger batch is normalized (to 0 for mean/mean_std)
    assert normalize(xs, [0, 0, 1], "mean")[2] == 0.0
    assert normalize(xs, [0, 0, 1], "mean_std")[2] == 0.0


def test_penalty_is_added_before_normalizing_and_originals_stay_raw() -> None:
    rewards = [[1.0, 0.5], [0.0], [2.0], [2.0]]
    penalties = [0.0, -0.1, -0.2, 0.0]
    s = compute_scores(rewards, penalties, group_ids=[0, 0, 1, 1], tags=["t"] * 4,
                       grouping="state", method="identity")
    assert s.original == [1.5, 0.0, 2.0, 2.0]  # what the group filter reads
    assert s.penalized == pytest.approx([1.5, -0.1, 1.8, 2.0])
    assert s.normalized == pytest.approx([1.5, -0.1, 1.8, 2.0])  # identity still penalizes
    s = compute_scores(rewards, penalties, [0, 0, 1, 1], ["t"] * 4, "state", "mean")
    assert s.normalized == pytest.approx([0.8, -0.8, -0.1, 0.1])
    assert s.original == [1.5, 0.0, 2.0, 2.0]


def test_groupings() -> None:
    gids, tags = [0, 0, 1, 1], ["a", "b", "a", "b"]
    assert group_keys(gids, tags, "state") == [0, 0, 1, 1]
    assert group_keys(gids, tags, "inductive") == ["a", "b", "a", "b"]
    assert group_keys(gids, tags, "batch") == [0, 0, 0, 0]
    xs = [[1.0], [2.0], [3.0], [6.0]]
    by_tag = compute_scores(xs, [0] * 4, gids, tags, "inductive", "mean").normalized
    assert by_tag == pytest.approx([-1.0, -2.0, 1.0, 2.0])
    batch = compute_scores(xs, [0] * 4, gids, tags, "batch", "mean").normalized
    assert batch == pytest.approx([-2.0, -1.0, 0.0, 3.0])


def test_bad_names_raise() -> None:
    with pytest.raises(ValueError, match="grouping"):
        group_keys([0], ["a"], "episode")
    with pytest.raises(ValueError, match="method"):
        normalize([1.0, 2.0], [0, 0], "zscore")
