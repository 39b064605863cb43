"""WebShop's reward as RAGEN computes it, on the small set.

The reference (``tests/fixtures/webshop_ragen/rewards.json.gz``) holds 18,910 purchases scored
by webshop-minimal's own ``get_reward`` (commit ec82552, the one RAGEN pins) outside the repo:
every goal's perfect purchase (the goal's product at its drawn price with the goal's options
clicked) and 12,000 random (goal, product, clicked options, price) cases: the goal's product,
a product of the same query or any product; the goal's options, one value of every option or
of some options; the drawn price, the bound itself, just above it or anything.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from turnpool.webshop.data import load_webshop
from turnpool.webshop.reward import (
    TitleNouns,
    bundled_title_nouns,
    fuzzy_score,
    normalize_color,
    option_matches,
    webshop_reward,
)

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "webshop_ragen" / "rewards.json.gz"


def _cases() -> dict[str, Any]:
    with gzip.open(FIXTURE, "rt", encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


def test_reward_equals_ragen_on_18910_cases() -> None:
    ref = _cases()
    data = load_webshop(draw_seed=ref["draw_seed"])
    assert len(ref["cases"]) >= 18_000
    wrong = []
    for i, c in enumerate(ref["cases"]):
        r = webshop_reward(data.by_asin[c["asin"]], data.goals[c["goal"]], c["price"],
                           c["options"])
        if abs(r.reward - c["reward"]) > 1e-9 or r.r_type != c["r_type"] \
                or abs(r.title_score - c["title_score"]) > 1e-12:
            wrong.append(i)
    assert wrong == []
    perfect = ref["cases"][:ref["n_perfect"]]
    assert ref["n_perfect"] == len(data.goals)
    assert sum(c["reward"] == 1 for c in perfect) == 6452  # 93.4%: the normaliser's quirk


def test_normaliser_quirk_and_fuzzy_rules() -> None:
    assert normalize_color("dash") == "ash"
    assert normalize_color("green2") == "green"
    assert normalize_color(("color", "dash")) == ("color", "dash")  # pairs: element equality
    assert normalize_color(("color", "navy")) == "navy"
    # a product sold in "dash" never matches a goal asking for colour "dash"
    assert option_matches(["dash"], {"color": "dash"}) == 0
    assert option_matches(["dark blue"], {"color": "dark blue"}) == 1
    assert fuzzy_score("Gluten-Free", "gluten free") == 100
    assert fuzzy_score("café", "caf") == 100  # characters 128-255 are dropped first


def test_price_bound_is_inclusive() -> None:
    data = load_webshop()
    goal = next(g for g in data.goals if g.price_upper < 1_000_000)
    product = data.by_asin[goal.asin]
    wanted = dict(goal.goal_options)
    at = webshop_reward(product, goal, goal.price_upper, wanted)
    above = webshop_reward(product, goal, goal.price_upper + 0.01, wanted)
    assert at.price_ok and not above.price_ok
    n = len(goal.attributes) + len(goal.goal_options) + 1
    assert at.reward - above.reward == pytest.approx(at.r_type / n)


def test_type_score_without_spacy_is_an_approximation_not_an_error() -> None:
    data = load_webshop()
    goal = data.goals[0]
    product = data.by_asin[goal.asin]
    nouns = TitleNouns()  # empty table: spaCy if installed, else the word fallback
    nouns._tried, nouns._nlp = True, None  # force the fallback
    r = webshop_reward(product, goal, 0.0, {}, nouns)
    words = nouns(product.title)  # repeated nouns count in the denominator, as in WebShop
    assert r.title_score == len(set(words)) / len(words) and r.r_type == 1.0
    other = dataclasses.replace(product, title="zzz qqq")
    assert webshop_reward(other, goal, 0.0, {}, nouns).r_type in (0.0, 0.1, 0.5, 1)
    assert bundled_title_nouns()(product.title)  # the shipped table knows every title
