"""Countdown: combine the given numbers with + − × ÷ into an expression equal to the target.

RAGEN-compatible one-step env. The observation is ``"Target: 24, nums: [4, 7, 8, 8]"``; the
action is an expression that must use exactly the given numbers (as a multiset). Reward:
``score`` (1) when it equals the target, ``format_score`` (0.1) when it uses the right numbers
but has another value, 0 otherwise. The episode ends after one step.

RAGEN's rules, kept exactly: the integers written in the answer must be the puzzle's numbers,
then the value decides between ``score`` and ``format_score``; a data file's rows are kept
when some ``±a ±b ±c ±d`` hits the target (``require_solution="ragen"``, RAGEN's filter;
``"any"`` also tries × and ÷); ``action_is_valid`` is True for any text. What differs:

* the expression is evaluated by :mod:`turnpool.envs.safe_math` (parsed, whitelisted, exact
  fractions, bounded), never by ``eval``; RAGEN's ``eval`` also accepts ``**`` and compares
  within 1e-5, so an answer with ``**`` gets ``format_score`` here;
* the data file is read once per process, not once per env instance.

Data: ``data_path`` (or RAGEN's ``train_path``) names a local JSONL / JSON / Parquet file with
columns ``target`` and ``nums``; without it, RAGEN's default ``data/countdown/train.parquet``
(relative to the working directory, as RAGEN reads it) when that file exists, else a bundled set
of generated puzzles is used (``scripts/gen_countdown.py``). As in RAGEN, the first
``max_instances`` rows are read and the unsolvable ones dropped (``require_solution``; the
bundled set is solvable by construction and not re-checked). ``reset(seed)`` shows puzzle
``seed % len(data)``, as RAGEN does, so a seed names a puzzle and consecutive seeds walk
through the set.

Example:
    >>> env = CountdownEnv()
    >>> obs, _ = env.reset(seed=0)
    >>> answer = oracle(obs, {})[0]
    >>> env.step(answer)[1]
    1.0
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any, Union

import turnpool.envs.datasets as datasets
from turnpool.envs.base import TextEnv
from turnpool.envs.safe_math import MAX_CHARS, evaluate

logger = logging.getLogger(__name__)

BUNDLED = "countdown.jsonl"
PATH_KEYS = ("data_path", "train_path")
#: where RAGEN (v1 and v2) reads its puzzles when no path is set, from the working directory
RAGEN_TRAIN_PATH = "data/countdown/train.parquet"
MAX_NUMS = 6

Puzzle = tuple[int, tuple[int, ...]]
_Value = Union[int, Fraction]
_Expr = Union[int, tuple[str, "_Expr", "_Expr"]]


# ------------------------------------------------------------------------------- scoring
def score_expression(
    expression: object, target: int, nums: Sequence[int], *, score: float = 1,
    format_score: float = 0.1, max_chars: int = MAX_CHARS,
) -> tuple[float, bool]:
    """``(reward, well_formed)`` for an answer to the puzzle ``(target, nums)``.

    RAGEN's rule: the integers written in the answer (runs of digits) must be ``nums`` as a
    multiset, else 0; then ``score`` if the expression equals the target, else
    ``format_score`` (also when it does not evaluate). The expression is evaluated by
    `turnpool.envs.safe_math` (exact fractions), never by ``eval``.
    """
    if not isinstance(expression, str) or len(expression) > max_chars:
        return 0, False
    written = sorted(int(d) for d in _DIGITS.findall(expression))
    result = evaluate(expression, max_chars=max_chars)
    if written != sorted(int(n) for n in nums):
        return 0, result.valid
    return (score if result.valid and result.value == target else format_score), result.valid


_DIGITS = re.compile(r"\d+")


def has_signed_sum(target: int, nums: Sequence[int]) -> bool:
    """RAGEN's solvability filter: some ``±n1 ±n2 ±n3 ±n4`` equals the target."""
    padded = list(nums) + [0] * max(0, 4 - len(nums))
    return any(sum(s * n for s, n in zip(signs, padded)) == target
               for signs in itertools.product((1, -1), repeat=len(padded)))


# ------------------------------------------------------------------------------- solver
def _divide(a: _Value, b: _Value) -> _Value:
    if isinstance(a, int) and isinstance(b, int):
        q, r = divmod(a, b)
        return q if r == 0 else Fraction(a, b)
    value = Fraction(a) / Fraction(b)
    return value.numerator if value.denominator == 1 else value


def _last_step(a: _Value, b: _Value, ea: _Expr, eb: _Expr, target: int) -> _Expr | None:
    # The final combination is checked against the target directly instead of building all
    # six candidates: this level holds most of the search's nodes.
    if a + b == target:
        return ("+", ea, eb)
    if a * b == target:
        return ("*", ea, eb)
    if a - b == target:
        return ("-", ea, eb)
    if b - a == target:
        return ("-", eb, ea)
    if b != 0 and a == target * b:
        return ("/", ea, eb)
    if a != 0 and b == target * a:
        return ("/", eb, ea)
    return None


def _search(values: list[_Value], exprs: list[_Expr], target: int,
            failed: set[tuple[_Value, ...]]) -> _Expr | None:
    n = len(values)
    if n == 2:
        return _last_step(values[0], values[1], exprs[0], exprs[1], target)
    key = tuple(sorted(values))
    if key in failed:
        return None
    for i in range(n):
        for j in range(i + 1, n):
            a, b, ea, eb = values[i], values[j], exprs[i], exprs[j]
            rest_v = [values[k] for k in range(n) if k != i and k != j]
            rest_e = [exprs[k] for k in range(n) if k != i and k != j]
            options: list[tuple[_Value, _Expr]] = [
                (a + b, ("+", ea, eb)), (a * b, ("*", ea, eb)),
                (a - b, ("-", ea, eb)), (b - a, ("-", eb, ea))]
            if b != 0:
                options.append((_divide(a, b), ("/", ea, eb)))
            if a != 0:
                options.append((_divide(b, a), ("/", eb, ea)))
            for value, expr in options:
                found = _search([*rest_v, value], [*rest_e, expr], target, failed)
                if found is not None:
                    return found
    failed.add(key)
    return None


def _render(expr: _Expr, top: bool = True) -> str:
    if isinstance(expr, int):
        return str(expr)
    op, left, right = expr
    text = f"{_render(left, False)} {op} {_render(right, False)}"
    return text if top else f"({text})"


def solve(target: int, nums: Sequence[int]) -> str | None:
    """An expression using every number exactly once that equals ``target``, or None.

    Exhaustive over + − × ÷ and all bracketings, in exact rational arithmetic (intermediate
    values may be negative or fractional, as the checker allows).

    >>> solve(24, [3, 3, 8, 8])
    '8 / (3 - (8 / 3))'
    """
    values = [int(n) for n in nums]
    if not values or len(values) > MAX_NUMS:
        return None
    if len(values) == 1:
        return str(values[0]) if values[0] == target else None
    found = _search(list(values), list(values), int(target), set())
    return None if found is None else _render(found)


# ------------------------------------------------------------------------------- data
def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _build_table(rows: list[dict[str, Any]], options: dict[str, Any]) -> tuple[Puzzle, ...]:
    puzzles: list[Puzzle] = []
    malformed = unsolvable = 0
    for row in rows[: options["max_instances"]]:
        target = _as_int(row.get("target"))
        raw_nums = row.get("nums")
        nums = [_as_int(n) for n in raw_nums] if isinstance(raw_nums, (list, tuple)) else []
        if target is None or not 1 <= len(nums) <= MAX_NUMS or any(n is None for n in nums):
            malformed += 1
            continue
        puzzle = (target, tuple(n for n in nums if n is not None))
        rule = options["require_solution"]
        if rule and not (has_signed_sum(*puzzle) if rule == "ragen" else solve(*puzzle)):
            unsolvable += 1
            continue
        puzzles.append(puzzle)
    if malformed or unsolvable:
        logger.warning("countdown data: skipped %d malformed and %d unsolvable rows",
                       malformed, unsolvable)
    if not puzzles:
        raise ValueError("countdown data has no usable puzzles (columns: target, nums)")
    return tuple(puzzles)


def data_key(config: dict[str, Any]) -> datasets.TableKey:
    """Which table an env with this config uses (file version and build options)."""
    path = datasets.resolve_path(config, PATH_KEYS, BUNDLED, RAGEN_TRAIN_PATH)
    bundled = path == datasets.bundled_path(BUNDLED)
    return datasets.table_key(
        "countdown", path, max_instances=int(config.get("max_instances") or 20000),
        require_solution=_filter_rule(config.get("require_solution", "ragen"), bundled))


def _filter_rule(value: Any, bundled: bool) -> str | bool:
    """``"ragen"`` (sums and differences only, RAGEN's filter), ``"any"`` (+ - * /) or False."""
    if bundled or value is False or value is None:
        return False
    if value is True or value == "ragen":
        return "ragen"
    if value == "any":
        return "any"
    raise ValueError(f"require_solution must be 'ragen', 'any' or false, got {value!r}")


def load_puzzles(config: dict[str, Any] | None = None) -> tuple[Puzzle, ...]:
    """The puzzles for a config (shared, loaded once per process)."""
    result: tuple[Puzzle, ...] = datasets.get_table(data_key(config or {}), _build_table)
    return result


# ------------------------------------------------------------------------------- env
class CountdownEnv(TextEnv):
    """One-step arithmetic puzzle; see the module docstring for rules and data."""

    action_kind = "expression"
    #: what RAGEN's env reports in ``info`` (the RAGEN facade shows only these)
    ragen_info_keys = ("action_is_effective", "action_is_valid", "success")
    #: RAGEN's env returns whole-number rewards as ints (the reward text reads ``1``)
    ragen_int_rewards = True
    instruction = (
        "You are solving the Countdown puzzle. Combine all the given numbers, each exactly "
        "once, with + - * / and parentheses into an expression equal to the target. Example: "
        "target 4 with nums [3, 5, 2]: <think>2 + 5 = 7 and 7 - 3 = 4.</think>"
        "<answer>2 + 5 - 3</answer>")

    #: RAGEN's invalid_act / invalid_act_score are accepted and unused (see __init__)
    extra_kwargs = frozenset({"invalid_act", "invalid_act_score"})

    def __init__(
        self, data_path: str | Path | None = None, train_path: str | Path | None = None,
        max_instances: int = 20000, require_solution: bool | str = "ragen",
        score: float = 1, format_score: float = 0.1, max_expression_chars: int = MAX_CHARS,
        **config: Any,
    ) -> None:
        # RAGEN's invalid_act / invalid_act_score and render_mode are accepted and unused:
        # the format penalty for unparseable turns is charged by the manager.
        super().__init__(data_path=data_path, train_path=train_path,
                         max_instances=max_instances, require_solution=require_solution,
                         score=score, format_score=format_score,
                         max_expression_chars=max_expression_chars, **config)
        # ints stay ints: RAGEN's text reads "Your answer get 1 points."
        self.score = score if isinstance(score, int) else float(score)
        self.format_score = format_score if isinstance(format_score, int) else float(format_score)
        self.max_expression_chars = int(max_expression_chars)
        self._data_key = data_key(self.config)
        load_puzzles(self.config)  # fail at construction, not at the first reset
        self.index = 0
        self.done = False
        self._text = ""

    @property
    def puzzles(self) -> tuple[Puzzle, ...]:
        """The shared puzzle table (not part of ``get_state`` snapshots)."""
        table: tuple[Puzzle, ...] = datasets.get_table(self._data_key, _build_table)
        return table

    @property
    def puzzle(self) -> Puzzle:
        return self.puzzles[self.index]

    def _reset(self, seed: int, options: dict[str, Any]) -> str:
        self.index = seed % len(self.puzzles)
        self.done = False
        self._text = puzzle_text(*self.puzzle)
        return self._text

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.done:
            return self._text, 0.0, True, False, {"action_is_valid": False}
        target, nums = self.puzzle
        reward, _ = score_expression(
            action, target, nums, score=self.score, format_score=self.format_score,
            max_chars=self.max_expression_chars)
        self.done = True
        self._text = f"Your answer get {reward} points."
        return self._text, reward, True, False, {
            "success": reward == self.score, "action_is_valid": isinstance(action, str),
            "action_is_effective": reward > 0}

    def _render_text(self) -> str:
        return self._text


def puzzle_text(target: int, nums: Sequence[int]) -> str:
    """The observation for a puzzle (RAGEN's format)."""
    return f"Target: {target}, nums: {list(nums)}"


_OBS = re.compile(r"Target:\s*(-?\d{1,12}),\s*nums:\s*\[([\d,\s-]{0,200})\]")


def oracle(obs: str, env_config: dict[str, Any]) -> list[str]:
    """A correct expression for the puzzle in ``obs`` (``[]`` if none or not a puzzle)."""
    match = _OBS.search(obs) if isinstance(obs, str) else None
    if match is None:
        return []
    try:
        nums = [int(n) for n in match.group(2).split(",") if n.strip()]
    except ValueError:
        return []
    solution = solve(int(match.group(1)), nums)
    return [] if solution is None else [solution]


CountdownEnv.oracle = staticmethod(oracle)
