"""The safe expression checker: exact values, a closed language, and no way to make it raise."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnpool.envs.safe_math import MAX_CHARS, MAX_DEPTH, Evaluation, evaluate

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(("text", "value", "numbers"), [
    ("1 + 2", 3, (1, 2)),
    ("(3 + 5) * 2 / 4", 4, (3, 5, 2, 4)),
    ("1/3*3", 1, (1, 3, 3)),
    ("2 / 3", Fraction(2, 3), (2, 3)),
    ("-3 + 10", 7, (3, 10)),
    ("+4 - -4", 8, (4, 4)),
    ("8 / (3 - 8 / 3)", 24, (8, 3, 8, 3)),
    ("7 × 6 ÷ 2 − 1", 20, (7, 6, 2, 1)),
    ("  42\t", 42, (42,)),
    ("0", 0, (0,)),
])
def test_valid_expressions_are_exact(text: str, value: Fraction, numbers: tuple[int, ...]) -> None:
    result = evaluate(text)
    assert result.valid, result.error
    assert result.value == value
    assert isinstance(result.value, Fraction)
    assert result.numbers == numbers


HOSTILE = [
    "9**9**9**9",
    "2**10",
    "__import__('os').system('true')",
    "().__class__.__bases__[0].__subclasses__()",
    "open('/etc/passwd').read()",
    "lambda: 1",
    "x + 1",
    "True + 1",
    "1 if 1 else 2",
    "1 < 2",
    "[1, 2]",
    "{1: 2}",
    "1.5 + 2",
    "1e3",
    "007 + 1",
    "1_000 + 1",
    "0x10",
    "4 / (2 - 2)",
    "1 // 2",
    "7 % 3",
    "1 + \n2",
    "3 4",
    "(1 + 2",
    "",
    "   ",
    "1" * 150,
    "9999999 + 1",
    "999999 * 999999 * 999999",
    "(" * (MAX_DEPTH + 1) + "1" + ")" * (MAX_DEPTH + 1),
    "-" * 150 + "1",  # allowed nesting of unary minus: parses, must still not raise
    "1" + "+1" * 5000,
    "(" * 100_000,
    "1" * 1_000_000,
    "\x00",
    "1 + 2 = 3",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_text_is_rejected_or_bounded(text: str) -> None:
    result = evaluate(text)
    assert isinstance(result, Evaluation)
    if text == "-" * 150 + "1":
        assert result.valid and result.value == 1
    else:
        assert not result.valid and result.value is None and result.error


@pytest.mark.parametrize("value", [None, 5, b"1+2", ["1"], object()])
def test_non_strings_are_invalid(value: object) -> None:
    assert evaluate(value) == Evaluation(valid=False, error="not a string")


def test_length_bound_is_configurable() -> None:
    text = "+".join(["1"] * 150)  # 299 characters
    assert not evaluate(text).valid
    assert len(text) > MAX_CHARS
    assert evaluate(text, max_chars=400).value == 150


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_never_raises(text: str) -> None:
    result = evaluate(text)
    assert result.valid == (result.value is not None)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="0123456789+-*/() ", max_size=200))
def test_arithmetic_alphabet_never_raises(text: str) -> None:
    result = evaluate(text)
    assert result.valid == (result.value is not None)


def _trees(max_leaves: int = 6) -> st.SearchStrategy[tuple[str, Fraction, list[int]]]:
    # Literals below 100 keep every intermediate of six leaves far inside MAX_MAGNITUDE.
    leaf = st.integers(0, 99).map(lambda n: (str(n), Fraction(n), [n]))

    def combine(children: st.SearchStrategy[tuple[str, Fraction, list[int]]]
                ) -> st.SearchStrategy[tuple[str, Fraction, list[int]]]:
        def build(left: tuple[str, Fraction, list[int]], op: str,
                  right: tuple[str, Fraction, list[int]]) -> tuple[str, Fraction, list[int]]:
            a, b = left[1], right[1]
            if op == "/" and b == 0:
                op = "+"
            value = {"+": a + b, "-": a - b, "*": a * b}.get(op) if op != "/" else a / b
            assert value is not None
            return f"({left[0]} {op} {right[0]})", value, left[2] + right[2]
        return st.builds(build, children, st.sampled_from("+-*/"), children)

    return st.recursive(leaf, combine, max_leaves=max_leaves)


@settings(max_examples=200, deadline=None)
@given(_trees())
def test_random_trees_evaluate_exactly(tree: tuple[str, Fraction, list[int]]) -> None:
    text, value, numbers = tree
    result = evaluate(text)
    if len(text) > MAX_CHARS:
        assert not result.valid
        return
    assert result.valid, (text, result.error)
    assert result.value == value
    assert list(result.numbers) == numbers
