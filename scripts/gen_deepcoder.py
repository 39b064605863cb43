"""Generate the bundled DeepCoder problem set (``turnpool/data/deepcoder.jsonl``).

20 problem families written for turnpool (the statements, reference solutions and tests are
this project's own, under its licence), 12 variants each (a different constant in the
statement), 8 tests per problem computed by the family's reference solution on seeded random
inputs. 14 families are stdin/stdout programs, 6 are ``class Solution`` methods (function-call
tests in LiveCodeBench's format: one JSON literal per input line). Rows follow the
DeepCoder-Preview format: ``problem``, ``tests`` (a JSON string), ``metadata`` (a JSON string
with ``func_name``), ``starter_code``. Deterministic:
the same ``--seed`` writes the same file byte for byte.

    python scripts/gen_deepcoder.py --seed 7
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "turnpool" / "data" / "deepcoder.jsonl"
VARIANTS = 12
TESTS = 8
READ = "Read an integer n and then n integers (on the next line)."


def _nums(rng: random.Random, lo: int = -50, hi: int = 50, n_max: int = 12) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(rng.randint(1, n_max))]


def _stdin(nums: list[int]) -> str:
    return f"{len(nums)}\n{' '.join(map(str, nums))}\n"


def _primes_upto(n: int) -> int:
    return sum(1 for k in range(2, n + 1) if all(k % d for d in range(2, int(k ** 0.5) + 1)))


def _kadane(a: list[int]) -> int:
    best = cur = a[0]
    for x in a[1:]:
        cur = max(x, cur + x)
        best = max(best, cur)
    return best


def _longest_run(a: list[int]) -> int:
    best = run = 1
    for x, y in zip(a, a[1:]):
        run = run + 1 if x == y else 1
        best = max(best, run)
    return best


# (statement with {c}, constant for variant v, input maker, reference answer)
StdinFamily = tuple[str, Callable[[int], int], Callable[[random.Random, int], str],
                    Callable[[str, int], str]]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split()[1:]]


STDIN: list[StdinFamily] = [
    (READ + " Print their sum modulo {c}.", lambda v: 7 + 6 * v,
     lambda r, c: _stdin(_nums(r)), lambda t, c: str(sum(_ints(t)) % c)),
    (READ + " Print the largest minus the smallest, plus {c}.", lambda v: v,
     lambda r, c: _stdin(_nums(r)), lambda t, c: str(max(_ints(t)) - min(_ints(t)) + c)),
    (READ + " Print how many of them are divisible by {c}.", lambda v: 2 + v,
     lambda r, c: _stdin(_nums(r)), lambda t, c: str(sum(1 for x in _ints(t) if x % c == 0))),
    ("Read one line of lowercase letters. Print how many times the letter '{c}' occurs.",
     lambda v: "aeioustrnlmc"[v],  # type: ignore[return-value,arg-type]
     lambda r, c: "".join(r.choice("aeioustrnlmcxyz") for _ in range(r.randint(1, 30))) + "\n",
     lambda t, c: str(t.strip().count(str(c)))),
    (READ + " Print the {c}-th smallest of them (1-based), or -1 if n is smaller than {c}.",
     lambda v: 1 + v, lambda r, c: _stdin(_nums(r)),
     lambda t, c: str(sorted(_ints(t))[c - 1]) if len(_ints(t)) >= c else "-1"),
    ("Read n. Print the n-th Fibonacci number (F(0)=0, F(1)=1) modulo {c}.",
     lambda v: 10 + 9 * v, lambda r, c: f"{r.randint(0, 300)}\n",
     lambda t, c: str(_fib(int(t), c))),
    (READ + " All are positive. Print their greatest common divisor times {c}.",
     lambda v: 1 + v, lambda r, c: _stdin([r.randint(1, 12) * r.choice([2, 3, 6])
                                           for _ in range(r.randint(1, 8))]),
     lambda t, c: str(_gcd_all(_ints(t)) * c)),
    ("Read n. Print how many primes are at most n + {c}.", lambda v: 3 * v,
     lambda r, c: f"{r.randint(0, 400)}\n", lambda t, c: str(_primes_upto(int(t) + c))),
    ("Read a non-negative integer n. Repeatedly replace n by the sum of its digits until it "
     "has one digit; print that digit plus {c}.", lambda v: v,
     lambda r, c: f"{r.randint(0, 10 ** 9)}\n", lambda t, c: str(_root(int(t)) + c)),
    (READ + " Print the length of the longest run of equal adjacent values, times {c}.",
     lambda v: 1 + v, lambda r, c: _stdin(_nums(r, 0, 2)),
     lambda t, c: str(_longest_run(_ints(t)) * c)),
    (READ + " Print how many distinct values there are, plus {c}.", lambda v: v,
     lambda r, c: _stdin(_nums(r, 0, 6)), lambda t, c: str(len(set(_ints(t))) + c)),
    (READ + " Print how many values are strictly greater than every value before them, "
     "counting only those at least {c}.", lambda v: v - 6,
     lambda r, c: _stdin(_nums(r, -10, 10)), lambda t, c: str(_records(_ints(t), c))),
    (READ + " Print how many pairs i < j have a[i] + a[j] = {c}.", lambda v: v - 4,
     lambda r, c: _stdin(_nums(r, -6, 6)), lambda t, c: str(_pairs(_ints(t), c))),
    (READ + " Print them sorted in increasing order, each multiplied by {c}, separated by "
     "spaces.", lambda v: 1 + v, lambda r, c: _stdin(_nums(r)),
     lambda t, c: " ".join(str(x * c) for x in sorted(_ints(t)))),
]


def _fib(n: int, m: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, (a + b) % m
    return a % m


def _gcd_all(a: list[int]) -> int:
    from math import gcd
    g = 0
    for x in a:
        g = gcd(g, x)
    return g


def _root(n: int) -> int:
    while n >= 10:
        n = sum(int(d) for d in str(n))
    return n


def _records(a: list[int], c: int) -> int:
    best, count = None, 0
    for x in a:
        if best is None or x > best:
            best = x
            count += x >= c
    return count


def _pairs(a: list[int], c: int) -> int:
    return sum(1 for i in range(len(a)) for j in range(i + 1, len(a)) if a[i] + a[j] == c)


# (statement, method name, signature, constant, args maker, reference)
FuncFamily = tuple[str, str, str, Callable[[int], int], Callable[[random.Random], list[Any]],
                   Callable[[list[Any], int], Any]]
FUNCTIONAL: list[FuncFamily] = [
    ("Given a list of integers nums, return how many pairs i < j have nums[i] + nums[j] "
     "equal to {c}.", "countPairs", "nums: list[int]", lambda v: v - 5,
     lambda r: [_nums(r, -6, 6)], lambda a, c: _pairs(a[0], c)),
    ("Given a list of integers nums, return it rotated left by {c} positions.", "rotateLeft",
     "nums: list[int]", lambda v: v, lambda r: [_nums(r)],
     lambda a, c: a[0][c % len(a[0]):] + a[0][:c % len(a[0])]),
    ("Given a list of integers nums, return the largest sum of a non-empty contiguous "
     "subarray, plus {c}.", "maxSubarray", "nums: list[int]", lambda v: 10 * v,
     lambda r: [_nums(r)], lambda a, c: _kadane(a[0]) + c),
    ("Given a string s, return true if s reads the same backwards after removing every "
     "occurrence of the letter '{c}', else false.", "isPalindrome", "s: str",
     lambda v: "abcdefghijkl"[v],  # type: ignore[return-value,arg-type]
     lambda r: ["".join(r.choice("abc") for _ in range(r.randint(0, 7)))],
     lambda a, c: (lambda s: s == s[::-1])(a[0].replace(str(c), ""))),
    ("Given a string s of words separated by single spaces, return how many words are "
     "longer than {c} letters.", "countLong", "s: str", lambda v: v % 6,
     lambda r: [" ".join("x" * r.randint(1, 8) for _ in range(r.randint(1, 6)))],
     lambda a, c: sum(1 for w in a[0].split() if len(w) > c)),
    ("Given the coefficients of a polynomial (constant term first) and an integer x, return "
     "its value at x modulo {c}.", "evalPoly", "coeffs: list[int], x: int",
     lambda v: 11 + 10 * v, lambda r: [_nums(r, -9, 9, 6), r.randint(-5, 5)],
     lambda a, c: sum(k * a[1] ** i for i, k in enumerate(a[0])) % c),
]


def stdin_problem(fam: StdinFamily, v: int, rng: random.Random) -> dict[str, Any]:
    text, const, make, answer = fam
    c = const(v)
    tests = []
    for _ in range(TESTS):
        inp = make(rng, c)
        tests.append({"input": inp, "output": answer(inp, c) + "\n", "testtype": "stdin"})
    return {"problem": text.format(c=c), "tests": json.dumps(tests),
            "metadata": json.dumps({}), "starter_code": ""}


def functional_problem(fam: FuncFamily, v: int, rng: random.Random) -> dict[str, Any]:
    text, name, sig, const, make, answer = fam
    c = const(v)
    tests = []
    for _ in range(TESTS):
        args = make(rng)
        out = answer(args, c)
        tests.append({"input": "\n".join(json.dumps(a) for a in args),
                      "output": str(out),
                      "testtype": "functional"})
    starter = f"class Solution:\n    def {name}(self, {sig}):\n        "
    return {"problem": text.format(c=c), "tests": json.dumps(tests),
            "metadata": json.dumps({"func_name": name}), "starter_code": starter}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    rows = [stdin_problem(f, v, rng) for v in range(VARIANTS) for f in STDIN]
    rows += [functional_problem(f, v, rng) for v in range(VARIANTS) for f in FUNCTIONAL]
    with args.out.open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, sort_keys=True) + "\n")
    print(f"wrote {len(rows)} problems to {args.out}")


if __name__ == "__main__":
    main()
