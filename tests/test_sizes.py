"""The package's size rules, over every module under ``turnpool/`` (``bench/`` included): no
function longer than `MAX_FUNCTION_LINES` lines and at most `MAX_LONG_FILES` files longer than
`LONG_FILE_LINES` lines.

Ruff cannot say this: ``PLR0915`` counts statements and ``C901`` branches, neither lines, so a
long function of few statements (a table, a long call) passes both. A function's length runs
from its ``def`` (decorators left out) to its last line, nested functions included; a file's is
its number of lines.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import turnpool

ROOT = Path(turnpool.__file__).resolve().parent
MAX_FUNCTION_LINES = 80
LONG_FILE_LINES = 500
MAX_LONG_FILES = 4


def _modules() -> list[Path]:
    return sorted(ROOT.rglob("*.py"))


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_no_function_is_longer_than_80_lines() -> None:
    long = []
    for path in _modules():
        for fn in _functions(ast.parse(path.read_text(encoding="utf-8"))):
            lines = (fn.end_lineno or fn.lineno) - fn.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                long.append(f"{path.relative_to(ROOT.parent)}:{fn.lineno} {fn.name} ({lines})")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {', '.join(long)}"


def test_at_most_four_files_are_longer_than_500_lines() -> None:
    sizes = {path: len(path.read_text(encoding="utf-8").splitlines()) for path in _modules()}
    long = sorted(f"{p.relative_to(ROOT.parent)} ({n})" for p, n in sizes.items()
                  if n > LONG_FILE_LINES)
    assert len(long) <= MAX_LONG_FILES, (
        f"{len(long)} files over {LONG_FILE_LINES} lines (at most {MAX_LONG_FILES}): "
        f"{', '.join(long)}")


def test_the_rules_see_the_whole_package() -> None:
    names = {p.relative_to(ROOT).parts[0] for p in _modules()}
    assert {"bench", "cli", "envs", "pool", "serve", "worker"} <= names
