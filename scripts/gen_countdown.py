"""Generate the bundled Countdown puzzle set (``turnpool/data/countdown.jsonl``).

Each puzzle is made by drawing 3 or 4 numbers and folding them with random operations in a
random order; the result is kept when it is an integer in ``[1, max_target]``. Every puzzle
therefore has a solution by construction, and it is re-checked with the env's solver.
Deterministic: the same ``--seed`` writes the same file byte for byte.

    python scripts/gen_countdown.py --seed 2024 --count 3000
"""

from __future__ import annotations

import argparse
import json
import logging
from fractions import Fraction
from pathlib import Path

import numpy as np

from turnpool.envs.countdown import solve

logger = logging.getLogger("gen_countdown")

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "turnpool" / "data" / "countdown.jsonl"


def draw_puzzle(
    rng: np.random.Generator, max_num: int, max_target: int
) -> tuple[int, list[int]] | None:
    """One random ``(target, nums)``, or None when this draw's result is not a usable target."""
    count = int(rng.integers(3, 5))
    nums = [int(n) for n in rng.integers(1, max_num + 1, size=count)]
    values = [Fraction(n) for n in nums]
    while len(values) > 1:
        i, j = (int(k) for k in rng.choice(len(values), size=2, replace=False))
        a, b = values[i], values[j]
        op = "+-*/"[int(rng.integers(4))]
        if op == "/" and b == 0:
            return None
        result = a + b if op == "+" else a - b if op == "-" else a * b if op == "*" else a / b
        values = [v for k, v in enumerate(values) if k not in (i, j)] + [result]
    target = values[0]
    if target.denominator != 1 or not 1 <= target <= max_target:
        return None
    return int(target), nums


def generate(
    seed: int, count: int, max_num: int = 99, max_target: int = 100
) -> list[dict[str, object]]:
    """``count`` distinct puzzles (distinct as target plus multiset of numbers)."""
    rng = np.random.default_rng(seed)
    puzzles: list[dict[str, object]] = []
    seen: set[tuple[int, tuple[int, ...]]] = set()
    while len(puzzles) < count:
        drawn = draw_puzzle(rng, max_num, max_target)
        if drawn is None:
            continue
        target, nums = drawn
        key = (target, tuple(sorted(nums)))
        if key in seen:
            continue
        if solve(target, nums) is None:
            raise RuntimeError(f"generated puzzle without a solution: {drawn}")
        seen.add(key)
        puzzles.append({"target": target, "nums": nums})
    return puzzles


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    puzzles = generate(args.seed, args.count)
    args.out.write_text("".join(json.dumps(p) + "\n" for p in puzzles), encoding="utf-8")
    logger.info("wrote %d puzzles to %s", len(puzzles), args.out)


if __name__ == "__main__":
    main()
