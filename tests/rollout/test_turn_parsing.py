"""RAGEN-style turn parsing (``parse_response``), and model output as hostile input: huge
inputs and property tests over random text and tag soup check that neither the parser nor any
projection raises, inputs are untouched, outputs line up, and every "valid" action is one the
env accepts.
"""

from __future__ import annotations

import copy
import functools
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tests.rollout.projection_envs  # noqa: F401 - registers projection_test_grid and _free
from turnpool.rollout.projection import (
    MAX_EXPRESSION_CHARS,
    MAX_FREE_TEXT_CHARS,
    MAX_TEXT_CHARS,
    ParsedResponse,
    Projection,
    _find_tagged,
    _find_think_answer,
    parse_response,
    project_actions,
)
from turnpool.rollout.projection import projection_for as create_projection_function

pytestmark = pytest.mark.timeout(120)

TEXT_ENVS = ("countdown", "metamathqa", "webshop", "bandit")

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
