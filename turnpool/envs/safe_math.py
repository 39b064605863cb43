"""Exact, bounded arithmetic on untrusted expression text (Countdown answers).

LLM output is hostile input, so an expression is never handed to ``eval``. Instead:

1. the length is checked first (``len`` is O(1)), so a megabyte of text costs nothing;
2. only digits, ``+ - * / ( )`` and blanks may appear (``×``, ``÷`` and ``−`` are read as
   ``*``, ``/`` and ``-``), and parentheses may nest at most ``MAX_DEPTH`` deep;
3. ``ast.parse(mode="eval")`` builds the tree, and only ``BinOp`` (+ − × ÷), unary ``+``/``-``
   and non-negative integer literals are accepted: no powers, names, calls or attributes;
4. the tree is evaluated with ``fractions.Fraction`` (so ``1/3*3 == 1`` exactly) and every
   intermediate numerator and denominator must stay below ``MAX_MAGNITUDE``.

Anything else gives ``Evaluation(valid=False, ...)``; :func:`evaluate` never raises.

Example:
    >>> evaluate("(3 + 5) * 2 / 4")
    Evaluation(valid=True, value=Fraction(4, 1), numbers=(3, 5, 2, 4), error='')
    >>> evaluate("9**9**9").valid
    False
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from fractions import Fraction
from typing import Union

MAX_CHARS = 200
MAX_DEPTH = 32
MAX_LITERAL = 10**6
MAX_MAGNITUDE = 10**15

_ALLOWED = frozenset("0123456789+-*/() \t")
_UNICODE_OPS = str.maketrans({"×": "*", "÷": "/", "−": "-"})


@dataclass(frozen=True)
class Evaluation:
    """The outcome of :func:`evaluate`: the exact value and the literals in source order."""

    valid: bool
    value: Fraction | None = None
    numbers: tuple[int, ...] = ()
    error: str = ""


class _Reject(Exception):
    """Internal: the expression is outside the accepted language or bounds."""


def _invalid(reason: str) -> Evaluation:
    return Evaluation(valid=False, error=reason)


def _nesting_depth(text: str) -> int:
    depth = deepest = 0
    for ch in text:
        if ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
    return deepest


_Number = Union[int, Fraction]


def _bounded(value: _Number) -> _Number:
    if isinstance(value, int):
        if abs(value) > MAX_MAGNITUDE:
            raise _Reject("intermediate value too large")
        return value
    if abs(value.numerator) > MAX_MAGNITUDE or value.denominator > MAX_MAGNITUDE:
        raise _Reject("intermediate value too large")
    return value.numerator if value.denominator == 1 else value


def _divide(left: _Number, right: _Number) -> _Number:
    if right == 0:
        raise _Reject("division by zero")
    if isinstance(left, int) and isinstance(right, int) and left % right == 0:
        return left // right
    return Fraction(left) / Fraction(right)


# Values stay plain ints until a division is inexact: Fraction arithmetic costs ~50x more.
def _eval_node(node: ast.AST, numbers: list[int]) -> _Number:
    if isinstance(node, ast.Constant):
        value = node.value
        if type(value) is not int or not 0 <= value <= MAX_LITERAL:
            raise _Reject("only non-negative integer literals are allowed")
        numbers.append(value)
        return value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _eval_node(node.operand, numbers)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp):
        left = _eval_node(node.left, numbers)
        right = _eval_node(node.right, numbers)
        if isinstance(node.op, ast.Add):
            return _bounded(left + right)
        if isinstance(node.op, ast.Sub):
            return _bounded(left - right)
        if isinstance(node.op, ast.Mult):
            return _bounded(left * right)
        if isinstance(node.op, ast.Div):
            return _bounded(_divide(left, right))
        raise _Reject(f"operator {type(node.op).__name__} is not allowed")
    raise _Reject(f"{type(node).__name__} is not allowed")


def evaluate(text: object, *, max_chars: int = MAX_CHARS) -> Evaluation:
    """Evaluate an arithmetic expression exactly, or say why it is not acceptable."""
    if not isinstance(text, str):
        return _invalid("not a string")
    if len(text) > max_chars:
        return _invalid(f"longer than {max_chars} characters")
    text = text.translate(_UNICODE_OPS).strip()
    if not text:
        return _invalid("empty")
    if not _ALLOWED.issuperset(text):
        return _invalid("only digits, + - * / ( ) and spaces are allowed")
    if _nesting_depth(text) > MAX_DEPTH:
        return _invalid(f"parentheses nested deeper than {MAX_DEPTH}")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return _invalid("not a well-formed expression")
    numbers: list[int] = []
    try:
        value = _eval_node(tree.body, numbers)
    except _Reject as exc:
        return _invalid(str(exc))
    except RecursionError:
        return _invalid("expression nested too deeply")
    return Evaluation(valid=True, value=Fraction(value), numbers=tuple(numbers))
