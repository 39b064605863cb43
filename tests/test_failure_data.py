"""Failures are data: no failure class is ever read out of a message text.

Every failed env's class is set where it is decided (the host, the deadline, the backend, the
pool) and travels as a field (`Reply`'s ``failure``, `TurnResult.failure`, ``info["failure"]``).
This test reads the package's source with ``ast`` and fails on any test of a message text for a
failure word (``"timeout" in error``, ``"died" in str(exc)``, ...).
"""

from __future__ import annotations

import ast
from pathlib import Path

import turnpool
from turnpool.worker.failures import FAILURE_CLASSES

ROOT = Path(turnpool.__file__).resolve().parent

#: words that name a failure; a message tested for one of them is a class read from text
FAILURE_WORDS = (*FAILURE_CLASSES, "timeout", "timed out", "died", "dead", "lost", "killed",
                 "pickl", "construct", "interrupt")
#: what a message text is called
TEXT_NAMES = ("error", "err", "reason", "message", "msg", "text", "exc", "why", "cause")


def _is_text(node: ast.expr) -> bool:
    source = ast.unparse(node).lower()
    return any(name in source for name in TEXT_NAMES)


def _text_tests(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        left = node.left
        if not (isinstance(left, ast.Constant) and isinstance(left.value, str)):
            continue
        word = left.value.lower()
        for op, right in zip(node.ops, node.comparators):
            if (isinstance(op, (ast.In, ast.NotIn)) and _is_text(right)
                    and any(w in word for w in FAILURE_WORDS)):
                found.append(ast.unparse(node))
    # str methods on a message: error.startswith("timeout"), "timeout" == reason[:7], ...
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("startswith", "endswith", "find", "count")
                and _is_text(node.func.value)
                and any(isinstance(a, ast.Constant) and isinstance(a.value, str)
                        and any(w in a.value.lower() for w in FAILURE_WORDS)
                        for a in node.args)):
            found.append(ast.unparse(node))
    return found


def test_the_check_finds_a_class_read_from_text() -> None:
    old = 'failure = "timeout" if "timeout" in error else "worker_lost"\n'
    assert _text_tests(old) == ["'timeout' in error"]
    assert _text_tests('lost = str(exc).startswith("worker died")\n')
    assert not _text_tests('ok = "error" in info\n')  # a dict key, not a failure word


def test_no_failure_class_is_derived_from_an_error_message() -> None:
    found = {str(p.relative_to(ROOT)): hits for p in sorted(ROOT.rglob("*.py"))
             if (hits := _text_tests(p.read_text(encoding="utf-8")))}
    assert found == {}
