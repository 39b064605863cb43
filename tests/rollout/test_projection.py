"""Projection of LLM text to env actions, env by env: discrete tables, user envs, RAGEN's
formats and the text envs (countdown, metamathqa, bandit, webshop).

Random text, huge inputs and RAGEN-style turn parsing are in ``test_turn_parsing.py``.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import turnpool
from tests.rollout import projection_envs
from turnpool.rollout.projection import (
    MAX_EXPRESSION_CHARS,
    MAX_EXPRESSION_DEPTH,
    MAX_FREE_TEXT_CHARS,
    MAX_WEBSHOP_ACTION_CHARS,
    extract_action_text,
)
from turnpool.rollout.projection import projection_for as create_projection_function

pytestmark = pytest.mark.timeout(120)

SOKOBAN = {1: "Up", 2: "Down", 3: "Left", 4: "Right"}
FROZEN_LAKE = {1: "Left", 2: "Down", 3: "Right", 4: "Up"}


def _env_class_lookup(env_type: str) -> dict[int, str]:
    from turnpool.envs.registry import resolve

    cls, _ = resolve(env_type)
    assert cls.action_lookup is not None
    return dict(cls.action_lookup)


# --------------------------------------------------------------------------- discrete envs
def test_seed_example() -> None:
    f = create_projection_function("sokoban")
    assert f(["<action>up</action>", "<action>down</action>"]) == ([1, 2], [True, True])


def test_spec_example() -> None:
    f = turnpool.create_projection_function("sokoban")
    actions, valids = f(["<answer>Up</answer>", "<action>down</action>", "dance"])
    assert actions == [1, 2, f.invalid_action]
    assert valids == [True, True, False]
    assert f.invalid_action == 0


@pytest.mark.parametrize(("env_type", "table"), [("sokoban", SOKOBAN),
                                                 ("frozen_lake", FROZEN_LAKE)])
def test_discrete_names_map_to_env_ids(env_type: str, table: dict[int, str]) -> None:
    assert _env_class_lookup(env_type) == table
    f = create_projection_function(env_type)
    names = list(table.values())
    forms = [n for n in names] + [n.upper() for n in names] + [f"  {n.lower()}\n" for n in names]
    actions, valids = f(forms)
    assert actions == list(table) * 3
    assert all(valids)
    assert sorted(f.legal_actions) == sorted(table)


@pytest.mark.parametrize("env_type", ["sokoban", "frozen_lake"])
def test_discrete_projection_agrees_with_env_parse_action(env_type: str) -> None:
    env = turnpool.make(env_type)
    f = create_projection_function(env_type)
    for text in ["Up", "down", "LEFT", "right", "noop", "", "up!", "1"]:
        action, ok = f.project_one(text)
        parsed = env.parse_action(text)
        assert ok == (parsed is not None)
        if ok:
            assert action == parsed
        else:
            assert env.parse_action(action) is None  # the placeholder is rejected by the env


@pytest.mark.parametrize("text", [
    "upper-left", "up-left", "upward", "up.", "go up", "u p", "Up Down", "Up || Dance",
    "<answer>upper</answer>", "<action>stay up</action>", "1", "0", "",
    "<answer></answer>", "   ", "Üp", "up\u200b",
    "<answer>Left<answer>Right</answer>",  # the inner tag is removed: "LeftRight"
])
def test_no_substring_guessing(text: str) -> None:
    f = create_projection_function("sokoban")
    assert f([text]) == ([0], [False])


@pytest.mark.parametrize(("text", "expected"), [
    ("<think>push the box</think><answer>Left</answer>", 3),
    ("<think>a</think>\n\n <answer> RIGHT </answer>", 4),
    ("<answer>Down</answer>", 2),
    ("<action>up</action>", 1),
    ("Up", 1),
    ("  dOwN  ", 2),
    ("<|im_start|>Left<|im_end|>", 3),
    ("<answer>Right<|im_end|></answer>", 4),
    ("I will go <answer>Up</answer> now", 1),
    ("<answer><answer>Down</answer></answer>", 2),
    ("<answer><action>left</action></answer>", 3),
    # the think part may mention tags; the RAGEN pattern picks the answer after </think>
    ("<think>maybe <answer>Up</answer>?</think><answer>Down</answer>", 2),
    # first complete match wins
    ("<answer>Left</answer><answer>Right</answer>", 3),
])
def test_formats_and_first_match(text: str, expected: int) -> None:
    f = create_projection_function("sokoban")
    assert f([text]) == ([expected], [True])


@pytest.mark.parametrize("text", [
    "<answer>Up", "Up</answer>", "<think>x</think>Up", "<action>up", "up</action>",
    "</answer>Up<answer>", "<think>Up</think>",
])
def test_broken_tags_are_invalid(text: str) -> None:
    f = create_projection_function("sokoban")
    assert f([text]) == ([0], [False])


def test_user_env_table_and_placeholder_when_zero_is_an_id() -> None:
    f = create_projection_function("projection_test_grid")
    assert f.kind == "discrete"
    assert f.invalid_action == -1  # 0 is "Stay", so the placeholder moves below every id
    assert f(["stay", "<answer>JUMP</answer>", "crawl"]) == ([0, 1, -1], [True, True, False])
    # entry point strings work as well as registered names
    g = create_projection_function(f"{projection_envs.__name__}:_GridEnv")
    assert g(["duck"]) == ([2], [True])


def test_explicit_action_lookup_overrides_class() -> None:
    f = create_projection_function("sokoban", action_lookup={7: "Wait"})
    assert f(["wait", "up"]) == ([7, 0], [True, False])


def test_per_episode_table_returns_names_not_ids() -> None:
    f = create_projection_function("projection_test_shuffled")
    assert f.kind == "names"
    assert f(["red", "BLUE", "green"]) == (["Red", "Blue", ""], [True, True, False])


def test_env_without_table_is_free_text() -> None:
    f = create_projection_function("projection_test_free")
    assert f(["<answer> anything goes </answer>", "", "x" * (MAX_FREE_TEXT_CHARS + 1)]) == (
        ["anything goes", "", ""], [True, False, False])


def test_unknown_env_type_raises_at_creation_only() -> None:
    with pytest.raises(KeyError):
        create_projection_function("no_such_env_type")


# ------------------------------------------------------------------------------ text envs
def test_bandit_names_are_checked_against_the_env_arms() -> None:
    f = create_projection_function("bandit")
    assert f.kind == "names"
    actions, valids = f(["<answer>Dragon</answer>", "phoenix", "two words", "", "dragon!",
                         "<think>x</think><answer>Trader</answer>", "a" * 65])
    assert actions == ["dragon", "phoenix", "", "", "", "", ""]
    assert valids == [True, True, False, False, False, False, False]


def test_bandit_arms_come_from_env_kwargs() -> None:
    f = create_projection_function("bandit", env_kwargs={"lo_arm_name": "Goat",
                                                         "hi_arm_name": "Tiger"})
    assert f(["tiger", "<answer>GOAT</answer>", "dragon"]) == (
        ["Tiger", "Goat", ""], [True, True, False])


def test_names_unknown_fall_back_to_one_word() -> None:
    f = create_projection_function("projection_test_nonames")
    assert f.kind == "word"
    assert f(["Anything", "two words"]) == (["anything", ""], [True, False])


# ------------------------------------------------------------------------ RAGEN's formats
@pytest.mark.parametrize(("env_type", "text", "expected"), [
    ("sokoban", "<answer>Up || Left</answer>", [1, 3]),
    ("sokoban", "<think>two moves</think><answer>Up||Left||Down</answer>", [1, 3, 2]),
    ("sokoban", "<answer>Up || </answer>", 1),  # empty parts are dropped
    ("frozen_lake", "<answer>left || UP</answer>", [1, 4]),
    ("sokoban", "Right || Right || Right || Right || Right || Right || Right",
     [4, 4, 4, 4, 4]),  # cut to MAX_ACTIONS_PER_ANSWER, as RAGEN cuts to max_actions
    ("bandit", "<answer>dragon || phoenix</answer>", ["dragon", "phoenix"]),
])
def test_multi_action_answers(env_type: str, text: str, expected: Any) -> None:
    f = create_projection_function(env_type)
    assert f([text]) == ([expected], [True])


@pytest.mark.parametrize("text", ["<answer>Up || Dance</answer>", "<answer> || </answer>",
                                  "Up || up-left"])
def test_multi_action_with_one_bad_part_is_invalid(text: str) -> None:
    assert create_projection_function("sokoban")([text]) == ([0], [False])


@pytest.mark.parametrize(("text", "expected"), [
    ("<answer>(3 + 5) * 2 = 16</answer>", "(3 + 5) * 2"),
    ("(3 + 5) * 2 = 16", "(3 + 5) * 2"),
    ("<answer>16</answer>", "16"),
    ("1 + 2 = 3.0", "1 + 2"),
    ("1 + 2 = -3", "1 + 2"),
])
def test_countdown_trailing_result(text: str, expected: str) -> None:
    assert create_projection_function("countdown")([text]) == ([expected], [True])


@pytest.mark.parametrize("text", ["1 + 2 = x", "1 + 2 = 3 = 3", "= 3", "1 + 2 =",
                                  "1 + 2 = 3 + 0"])
def test_countdown_bad_result_is_invalid(text: str) -> None:
    assert create_projection_function("countdown")([text]) == ([""], [False])


def test_countdown_projection_is_scored_by_the_env() -> None:
    env = turnpool.make("countdown")
    obs, _ = env.reset(seed=0)
    answer = env.oracle(obs, {})[0]
    (action,), (ok,) = create_projection_function("countdown")([f"{answer} = 0"])
    assert ok and env.step(action)[4]["success"]


@pytest.mark.parametrize("text", [
    "<think>unclosed <answer>Down</answer>",
    "<think>a</think><think>b <answer>Down</answer>",
    "</think><answer>Down</answer><think>",
    "<answer>Down</answer></answer>",
    "<action>Down</action><action>",
])
def test_malformed_tags_are_invalid(text: str) -> None:
    assert create_projection_function("sokoban")([text]) == ([0], [False])


@pytest.mark.parametrize(("alias", "name"), [
    ("frozenlake", "frozen_lake"), ("FrozenLake", "frozen_lake"), ("Frozen-Lake", "frozen_lake"),
    ("SOKOBAN", "sokoban"), ("meta_math_qa", "metamathqa"), ("Bandit", "bandit"),
])
def test_env_name_aliases(alias: str, name: str) -> None:
    f, g = create_projection_function(alias), create_projection_function(name)
    assert (f.kind, dict(f.names)) == (g.kind, dict(g.names))
    assert turnpool.make(alias).__class__ is turnpool.make(name).__class__


def test_bandit_with_arm_names_is_exact() -> None:
    f = create_projection_function("bandit", arm_names=["Phoenix", "Dragon"])
    actions, valids = f(["DRAGON", "<answer>phoenix</answer>", "dragons", "drag", "Trader"])
    assert actions == ["Dragon", "Phoenix", "", "", ""]
    assert valids == [True, True, False, False, False]


def test_bandit_projection_is_accepted_by_env() -> None:
    env = turnpool.make("bandit")
    obs, _ = env.reset(seed=5)
    lookup = env.action_lookup_for_episode()
    assert lookup is not None and len(lookup) == 2
    f = create_projection_function("bandit", arm_names=list(lookup.values()))
    name = next(iter(lookup.values()))
    (action,), (ok,) = f([f"<answer>{name.upper()}</answer>"])
    assert ok and env.parse_action(action) is not None
    _, _, _, _, info = env.step(action)
    assert info["action_is_valid"]


@pytest.mark.parametrize(("text", "ok"), [
    ("<answer>(1 + 2) * 3</answer>", True),
    ("1+2*3-4/5", True),
    ("((7))", True),
    ("(1 + 2", False),
    ("1 + 2)", False),
    (")1 + 2(", False),
    ("1 + 2 = 3", True),  # RAGEN's "expression = result" form; the action is "1 + 2"
    ("__import__('os')", False),
    ("1e9", False),
    ("2 ** 8", True),  # syntactically plausible here; the env's parser rejects powers
    ("()", False),
    ("", False),
    ("1" * (MAX_EXPRESSION_CHARS + 1), False),
    ("1" * MAX_EXPRESSION_CHARS, True),
    ("\uff11 + 2", False),  # fullwidth digit is not an ASCII digit
    ("(3 × 4) ÷ 2 − 1", True),  # the env reads × ÷ − as * / -
    ("(" * MAX_EXPRESSION_DEPTH + "1" + ")" * MAX_EXPRESSION_DEPTH, True),
    ("(" * (MAX_EXPRESSION_DEPTH + 1) + "1" + ")" * (MAX_EXPRESSION_DEPTH + 1), False),
])
def test_countdown_expression_check(text: str, ok: bool) -> None:
    f = create_projection_function("countdown")
    (action,), (valid,) = f([text])
    assert valid == ok
    expected = (extract_action_text(text) or "").partition("=")[0].strip()
    assert action == (expected if ok else "")


def test_countdown_never_evaluates(tmp_path: Any) -> None:
    marker = tmp_path / "touched"
    f = create_projection_function("countdown")
    text = f"<answer>open({str(marker)!r}, 'w')</answer>"
    assert f([text]) == ([""], [False])
    assert not marker.exists()


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet="0123456789+-*/() \t×÷−.xe", max_size=40))
def test_property_countdown_accepts_whatever_the_env_accepts(text: str) -> None:
    """Never a false "invalid": an expression the env can score is valid here too."""
    from turnpool.envs.safe_math import evaluate

    (action,), (ok,) = create_projection_function("countdown")([text])
    if evaluate(text).valid:
        assert ok and evaluate(action).valid


def test_metamathqa_answer_text() -> None:
    f = create_projection_function("metamathqa")
    actions, valids = f(["<think>2+2</think><answer> 4 </answer>", "\\frac{1}{2}", "",
                         "<answer>   </answer>", "y" * (MAX_FREE_TEXT_CHARS + 1)])
    assert actions == ["4", "\\frac{1}{2}", "", "", ""]
    assert valids == [True, True, False, False, False]


@pytest.mark.parametrize(("text", "expected"), [
    ("<answer>search[red running shoes]</answer>", "search[red running shoes]"),
    ("click[Buy Now]", "click[Buy Now]"),
    ("Click[ < Prev ]", "click[< Prev]"),
    ("search [shoes]", "search[shoes]"),
    ("click[item [XL] blue]", "click[item [XL] blue]"),
    ("search[]", None),
    ("search[   ]", None),
    ("buy[shoes]", None),
    ("search shoes", None),
    ("search[shoes", None),
    ("clicked[x]", None),
    ("search[" + "x" * MAX_WEBSHOP_ACTION_CHARS + "]", None),
])
def test_webshop_actions(text: str, expected: str | None) -> None:
    f = create_projection_function("webshop")
    assert f([text]) == ([expected or ""], [expected is not None])


def test_projection_pickles_for_worker_processes() -> None:
    f = create_projection_function("frozen_lake")
    g = pickle.loads(pickle.dumps(f))
    assert g(["up", "Left", "x"]) == ([4, 1, 0], [True, True, False])
