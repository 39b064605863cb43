"""Projection of LLM text to env actions, and RAGEN-style turn parsing.

Model output is treated as hostile: the property tests feed random text, random tag soup and
huge inputs and check that nothing raises, inputs are untouched, outputs line up, and every
"valid" action is one the env accepts.
"""

from __future__ import annotations

import copy
import functools
import pickle
import re
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import turnpool
from turnpool.envs.base import TextEnv
from turnpool.envs.registry import register
from turnpool.rollout.projection import (
    MAX_EXPRESSION_CHARS,
    MAX_EXPRESSION_DEPTH,
    MAX_FREE_TEXT_CHARS,
    MAX_TEXT_CHARS,
    MAX_WEBSHOP_ACTION_CHARS,
    ParsedResponse,
    Projection,
    _find_tagged,
    _find_think_answer,
    extract_action_text,
    parse_response,
    project_actions,
)
from turnpool.rollout.projection import projection_for as create_projection_function

pytestmark = pytest.mark.timeout(120)

SOKOBAN = {1: "Up", 2: "Down", 3: "Left", 4: "Right"}
FROZEN_LAKE = {1: "Left", 2: "Down", 3: "Right", 4: "Up"}
TEXT_ENVS = ("countdown", "metamathqa", "webshop", "bandit")


class _GridEnv(TextEnv):
    """A user env registered by entry point, with its own action table (0 is a real id)."""

    action_lookup: ClassVar[dict[int, str] | None] = {0: "Stay", 1: "Jump", 2: "Duck"}


class _FreeTextEnv(TextEnv):
    """A user env without an action table: any text is an action."""


class _ShuffledEnv(TextEnv):
    """A user env whose id -> name table changes per episode, like bandit's arms."""

    action_lookup: ClassVar[dict[int, str] | None] = {1: "Red", 2: "Blue"}

    def action_lookup_for_episode(self) -> dict[int, str] | None:
        return {1: "Blue", 2: "Red"}


class _NoNamesEnv(TextEnv):
    """Names that change per episode, none known before a reset."""

    action_kind: ClassVar[str | None] = "names"


register("projection_test_nonames", f"{__name__}:_NoNamesEnv")
register("projection_test_grid", f"{__name__}:_GridEnv")
register("projection_test_free", f"{__name__}:_FreeTextEnv")
register("projection_test_shuffled", f"{__name__}:_ShuffledEnv")


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
    g = create_projection_function(f"{__name__}:_GridEnv")
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


# ------------------------------------------------------------------------- parse_response
def test_parse_response_ragen_think_answer() -> None:
    r = parse_response("<think> I should push </think>\n<answer>Up || Left ||  || Down</answer>")
    assert r == ParsedResponse("I should push", ["Up", "Left", "Down"], True,
                               "<think>I should push</think><answer>Up || Left || Down</answer>")
    think, actions, ok, text = r  # a NamedTuple also unpacks
    assert ok and actions == ["Up", "Left", "Down"]


def test_parse_response_truncates_to_max_actions() -> None:
    text = "<think>t</think><answer>" + "||".join(["Up"] * 9) + "</answer>"
    r = parse_response(text, max_actions=3)
    assert r.actions == ["Up", "Up", "Up"]
    assert r.text == "<think>t</think><answer>Up || Up || Up</answer>"
    assert parse_response(text).actions == ["Up"] * 5


def test_parse_response_custom_separator_and_no_think() -> None:
    r = parse_response("<answer>a, b,,c</answer>", action_sep=",", enable_think=False)
    assert r == ParsedResponse("", ["a", "b", "c"], True, "<answer>a , b , c</answer>")
    # without think the think block is ignored, the answer still found
    assert parse_response("<think>x</think><answer>Up</answer>", enable_think=False).actions == [
        "Up"]


def test_parse_response_requires_think_when_enabled() -> None:
    r = parse_response("<answer>Up</answer>")
    assert r == ParsedResponse("", [], False, "<answer>Up</answer>")
    r = parse_response("<think>x</think> junk <answer>Up</answer>")
    assert not r.format_valid and r.actions == []


def test_parse_response_empty_answer_is_format_invalid() -> None:
    r = parse_response("<think>x</think><answer> || </answer>")
    assert r.actions == [] and not r.format_valid
    assert r.text == "<think>x</think><answer></answer>"


def test_parse_response_strips_special_tokens_including_reassembled() -> None:
    r = parse_response("<|im_start|><think><think>a</think><answer>Up<|im_end|></answer>")
    assert r.think == "a" and r.actions == ["Up"]
    r = parse_response("<think><thi<think>nk>x</think><answer><ans<answer>wer>Up</answer>")
    assert r.think == "x" and r.actions == ["Up"]


def test_parse_response_action_tag_style() -> None:
    r = parse_response("<think>t</think><action>up||down</action>", answer_tag="action")
    assert r.actions == ["up", "down"]
    assert r.text == "<think>t</think><action>up || down</action>"


def test_parse_response_then_project_each_action() -> None:
    r = parse_response("<think>t</think><answer>Up || jump || LEFT</answer>")
    assert project_actions("sokoban", r.actions) == [(1, True), (0, False), (3, True)]


@pytest.mark.parametrize("kwargs", [{"action_sep": ""}, {"max_actions": 0},
                                    {"answer_tag": "a>b"}])
def test_parse_response_rejects_bad_configuration(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        parse_response("<think>t</think><answer>Up</answer>", **kwargs)


def test_non_string_inputs_are_invalid_not_errors() -> None:
    f = create_projection_function("sokoban")
    junk: list[Any] = [None, b"<answer>Up</answer>", 1, ["Up"], {"a": 1}]
    assert f(junk) == ([0] * 5, [False] * 5)
    assert parse_response(None) == ParsedResponse("", [], False, "")
    with pytest.raises(TypeError):
        f("Up")  # type: ignore[arg-type]  # a single string is a caller bug, not model output


# ------------------------------------------------------------------------- hostile inputs
HOSTILE = [
    "",
    "\x00\x01\xff" * 1000,
    "\ud800\udfff",  # lone surrogates
    "\U0001f600" * 5000,
    "<answer>" * 200_000,  # 1.6 MB of openings: quadratic for lazy regexes
    "<think>" * 100_000 + "</think>" * 100_000,
    "<think></think>" * 100_000 + "<answer>",
    "<think>" + " " * 500_000 + "</think>" + " " * 500_000,
    "</think>\n" * 100_000,
    "x" * 1_000_000 + "<answer>Up</answer>",
    "<answer>" + "a" * 1_000_000 + "</answer>",
    "<<<<<<<thththinkinkink>>>>>>" * 10_000,
    "<answer>\n</answer>" * 10_000,
    "<answer>Up</answer>" * 50_000,
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("env_type", ["sokoban", "frozen_lake", *TEXT_ENVS])
def test_hostile_texts_return(env_type: str) -> None:
    f = create_projection_function(env_type)
    texts = list(HOSTILE)
    snapshot = list(texts)
    actions, valids = f(texts)
    assert texts == snapshot
    assert len(actions) == len(valids) == len(texts)
    assert valids[0] is False
    for text in HOSTILE:
        r = parse_response(text)
        assert isinstance(r, ParsedResponse)
        assert len(r.text) <= MAX_TEXT_CHARS + 64
        assert len(r.actions) <= 5


def test_long_text_is_cut_before_search() -> None:
    f = create_projection_function("sokoban")
    early = "<answer>Up</answer>" + "x" * 2 * MAX_TEXT_CHARS
    late = "x" * MAX_TEXT_CHARS + "<answer>Up</answer>"
    assert f([early, late]) == ([1, 0], [True, False])


# ---------------------------------------------------------------------------- properties
TAG_PIECES = ["<think>", "</think>", "<answer>", "</answer>", "<action>", "</action>",
              "<|im_start|>", "<|im_end|>", "||", " ", "\n", "<", ">", "/", "think", "answer",
              "Up", "down", "LEFT", "right", "(1+2)*3", "search[x]", "click[y]", "dragon", "42"]
tag_soup = st.lists(st.one_of(st.sampled_from(TAG_PIECES), st.text(max_size=5)),
                    max_size=30).map("".join)
any_text = st.one_of(st.text(max_size=300), tag_soup)
any_item = st.one_of(any_text, st.none(), st.binary(max_size=20), st.integers())

_ENV_TYPES = ["sokoban", "frozen_lake", *TEXT_ENVS, "projection_test_grid",
              "projection_test_free"]
_PROJECTION_NAMES = sorted([*_ENV_TYPES, "bandit_named"])


@functools.cache
def _projection(name: str) -> Projection:
    if name == "bandit_named":
        return create_projection_function("bandit", arm_names=["Phoenix", "Dragon"])
    return create_projection_function(name)


def _is_legal(projection: Projection, action: Any) -> bool:
    if isinstance(action, list):  # a multi-action answer
        return 1 < len(action) <= projection.max_actions and all(
            _is_legal(projection, a) for a in action)
    if projection.kind in ("discrete", "names"):
        return action in projection.legal_actions
    if projection.env_type == "countdown":
        return re.fullmatch(rf"[0-9+\-*/() \t×÷−]{{1,{MAX_EXPRESSION_CHARS}}}", action) is not None
    if projection.env_type == "webshop":
        return re.fullmatch(r"(search|click)\[\S.*\]", action, re.DOTALL) is not None
    if projection.env_type == "bandit":
        return action == action.lower() and action.strip() == action and " " not in action
    return isinstance(action, str) and 0 < len(action) <= MAX_FREE_TEXT_CHARS


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=st.lists(any_item, max_size=8), name=st.sampled_from(_PROJECTION_NAMES))
def test_property_projection_is_total_pure_and_sound(texts: list[Any], name: str) -> None:
    projection = _projection(name)
    snapshot = copy.deepcopy(texts)
    actions, valids = projection(texts)
    assert texts == snapshot
    assert len(actions) == len(valids) == len(texts)
    for action, ok in zip(actions, valids):
        assert isinstance(ok, bool)
        if ok:
            assert _is_legal(projection, action)
        else:
            assert action == projection.invalid_action
    # deterministic: the same call gives the same answer
    assert projection(texts) == (actions, valids)


@settings(max_examples=150, deadline=None)
@given(inner=any_text, name=st.sampled_from(_PROJECTION_NAMES),
       wrap=st.sampled_from(["<answer>{}</answer>", "<action>{}</action>",
                             "<think>x</think><answer>{}</answer>", "{}"]))
def test_property_wrapped_text_matches_bare_text(inner: str, name: str, wrap: str) -> None:
    projection = _projection(name)
    if any(marker in inner for marker in ("<think>", "</think>", "<answer>", "</answer>",
                                          "<action>", "</action>")):
        return  # tag soup changes which tag wins; covered by the totality property
    assert projection([wrap.format(inner)]) == projection([inner])


@settings(max_examples=300, deadline=None)
@given(text=tag_soup)
def test_property_tag_search_matches_ragen_regex(text: str) -> None:
    think = re.search(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", text, re.DOTALL)
    assert _find_think_answer(text, "answer") == (think.groups() if think else None)
    answer = re.search(r"<answer>(.*?)</answer>", text, re.DOTALL)
    assert _find_tagged(text, "answer") == (answer.group(1) if answer else None)


@settings(max_examples=200, deadline=None)
@given(text=any_text, max_actions=st.integers(1, 6), enable_think=st.booleans())
def test_property_parse_response(text: str, max_actions: int, enable_think: bool) -> None:
    r = parse_response(text, max_actions=max_actions, enable_think=enable_think)
    assert len(r.actions) <= max_actions
    assert r.format_valid == bool(r.actions)
    assert all(a and a == a.strip() and "||" not in a for a in r.actions)
    if not r.format_valid and not r.actions and r.text == text:
        return
    if r.format_valid:
        # the canonical text parses back to the same turn
        again = parse_response(r.text, max_actions=max_actions, enable_think=enable_think)
        assert again == r


def test_projection_pickles_for_worker_processes() -> None:
    f = create_projection_function("frozen_lake")
    g = pickle.loads(pickle.dumps(f))
    assert g(["up", "Left", "x"]) == ([4, 1, 0], [True, True, False])
