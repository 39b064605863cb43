"""Generate the bundled MetaMathQA-style sample (``turnpool/data/metamathqa_sample.jsonl``).

Arithmetic word problems from templates, in MetaMathQA's schema: ``query`` (the question),
``response`` (worked steps ending in ``"The answer is: X"``) and ``type``. Questions are
distinct. Deterministic: the same ``--seed`` writes the same file byte for byte.

    python scripts/gen_metamathqa.py --seed 7 --count 1500
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable
from math import gcd
from pathlib import Path

import numpy as np

logger = logging.getLogger("gen_metamathqa")

DEFAULT_OUT = (Path(__file__).resolve().parents[1] / "turnpool" / "data"
               / "metamathqa_sample.jsonl")

NAMES = [("Ava", "she"), ("Ben", "he"), ("Chloe", "she"), ("Diego", "he"), ("Emma", "she"),
         ("Farid", "he"), ("Grace", "she"), ("Hiro", "he"), ("Ines", "she"), ("Jonas", "he"),
         ("Kira", "she"), ("Liam", "he"), ("Maya", "she"), ("Noah", "he"), ("Olga", "she"),
         ("Pablo", "he"), ("Quinn", "she"), ("Ravi", "he"), ("Sara", "she"), ("Tomas", "he")]
ITEMS = ["apples", "marbles", "stickers", "pencils", "cookies", "stamps", "books", "shells",
         "cards", "balloons", "oranges", "coins"]
GOODS = [("notebook", "pen"), ("sandwich", "juice"), ("ticket", "poster"), ("shirt", "hat"),
         ("cake", "candle"), ("plant", "pot")]

Problem = tuple[str, str, str]  # (query, worked steps, answer)


def _int(rng: np.random.Generator, lo: int, hi: int) -> int:
    """An integer in ``[lo, hi]``."""
    return int(rng.integers(lo, hi + 1))


def _person(rng: np.random.Generator) -> tuple[str, str]:
    return NAMES[_int(rng, 0, len(NAMES) - 1)]


def _item(rng: np.random.Generator) -> str:
    return ITEMS[_int(rng, 0, len(ITEMS) - 1)]


def buy_and_give(rng: np.random.Generator) -> Problem:
    (name, pron), item = _person(rng), _item(rng)
    a, b = _int(rng, 5, 80), _int(rng, 2, 40)
    c = _int(rng, 1, a + b - 1)
    q = (f"{name} has {a} {item}. {pron.capitalize()} gets {b} more and then gives {c} to a "
         f"friend. How many {item} does {name} have now?")
    s = f"{name} starts with {a} and gets {b} more, so {a} + {b} = {a + b}. " \
        f"After giving away {c}, {pron} has {a + b} - {c} = {a + b - c}."
    return q, s, str(a + b - c)


def boxes(rng: np.random.Generator) -> Problem:
    item = _item(rng)
    a, b = _int(rng, 3, 25), _int(rng, 2, 30)
    q = f"Each box holds {a} {item}. How many {item} are there in {b} boxes?"
    return q, f"There are {b} boxes of {a}, so {b} * {a} = {a * b}.", str(a * b)


def share(rng: np.random.Generator) -> Problem:
    (name, _), item = _person(rng), _item(rng)
    each, friends = _int(rng, 2, 30), _int(rng, 2, 12)
    total = each * friends
    q = (f"{name} shares {total} {item} equally among {friends} friends. How many {item} "
         f"does each friend get?")
    return q, f"Each friend gets {total} / {friends} = {each}.", str(each)


def shopping(rng: np.random.Generator) -> Problem:
    first, second = GOODS[_int(rng, 0, len(GOODS) - 1)]
    a, b = _int(rng, 2, 40), _int(rng, 1, 20)
    n1, n2 = _int(rng, 2, 9), _int(rng, 2, 9)
    total = a * n1 + b * n2
    q = (f"A {first} costs ${a} and a {second} costs ${b}. How much do {n1} {first}s and "
         f"{n2} {second}s cost in total, in dollars?")
    s = f"The {first}s cost {n1} * {a} = {a * n1} and the {second}s cost {n2} * {b} = " \
        f"{b * n2}, so the total is {a * n1} + {b * n2} = {total}."
    return q, s, str(total)


def linear(rng: np.random.Generator) -> Problem:
    a, x, b = _int(rng, 2, 12), _int(rng, -15, 25), _int(rng, 1, 60)
    c = a * x + b
    q = f"If {a}x + {b} = {c}, what is the value of x?"
    s = f"Subtracting {b} from both sides gives {a}x = {c - b}, so x = {c - b} / {a} = {x}."
    return q, s, str(x)


def percent(rng: np.random.Generator) -> Problem:
    p = [5, 10, 12, 15, 20, 25, 30, 40, 50, 60, 75, 80][_int(rng, 0, 11)]
    step = 100 // gcd(p, 100)
    n = step * _int(rng, 1, max(1, 600 // step))
    q = f"What is {p}% of {n}?"
    return q, f"{p}% of {n} is {p} / 100 * {n} = {p * n // 100}.", str(p * n // 100)


def rectangle(rng: np.random.Generator) -> Problem:
    a, b = _int(rng, 2, 40), _int(rng, 2, 40)
    if rng.random() < 0.5:
        q = f"A rectangle is {a} cm long and {b} cm wide. What is its perimeter, in centimeters?"
        return q, f"The perimeter is 2 * ({a} + {b}) = {2 * (a + b)}.", str(2 * (a + b))
    q = (f"A rectangle is {a} meters long and {b} meters wide. What is its area, in square "
         f"meters?")
    return q, f"The area is {a} * {b} = {a * b}.", str(a * b)


def average(rng: np.random.Generator) -> Problem:
    count = _int(rng, 3, 5)
    while True:  # redraw until the number that fixes the mean is a positive integer
        nums = [_int(rng, 1, 99) for _ in range(count - 1)]
        mean = _int(rng, 10, 90)
        last = mean * count - sum(nums)
        if 1 <= last <= 120:
            break
    nums.append(last)
    q = f"What is the average of {', '.join(map(str, nums[:-1]))} and {nums[-1]}?"
    s = f"The sum is {sum(nums)} and there are {count} numbers, so the average is " \
        f"{sum(nums)} / {count} = {mean}."
    return q, s, str(mean)


def travel(rng: np.random.Generator) -> Problem:
    v, t = _int(rng, 20, 120), _int(rng, 2, 9)
    vehicle = ["train", "car", "bus", "boat"][_int(rng, 0, 3)]
    q = f"A {vehicle} travels at {v} km per hour for {t} hours. How many kilometers does it go?"
    return q, f"Distance is speed times time: {v} * {t} = {v * t}.", str(v * t)


def unknown_days(rng: np.random.Generator) -> Problem:
    name, pron = _person(rng)
    per_day, days = _int(rng, 5, 60), _int(rng, 2, 20)
    q = (f"{name} reads {per_day} pages a day. After x days {pron} has read {per_day * days} "
         f"pages. What is the value of the unknown variable x?")
    s = f"We have {per_day}x = {per_day * days}, so x = {per_day * days} / {per_day} = {days}."
    return q, s, str(days)


def remainder(rng: np.random.Generator) -> Problem:
    a, b = _int(rng, 20, 999), _int(rng, 3, 19)
    q = f"What is the remainder when {a} is divided by {b}?"
    s = f"{a} = {b} * {a // b} + {a % b}, so the remainder is {a % b}."
    return q, s, str(a % b)


def squares(rng: np.random.Generator) -> Problem:
    a, b = _int(rng, 2, 40), _int(rng, 1, 30)
    q = f"What is the value of {a}^2 - {b}^2?"
    s = f"{a}^2 - {b}^2 = {a * a} - {b * b} = {a * a - b * b}."
    return q, s, str(a * a - b * b)


def fractions(rng: np.random.Generator) -> Problem:
    a, b, c, d = _int(rng, 1, 9), _int(rng, 2, 12), _int(rng, 1, 9), _int(rng, 2, 12)
    num, den = a * d + c * b, b * d
    g = gcd(num, den)
    num, den = num // g, den // g
    answer = str(num) if den == 1 else f"\\frac{{{num}}}{{{den}}}"
    q = (f"What is $\\frac{{{a}}}{{{b}}} + \\frac{{{c}}}{{{d}}}$? Express your answer as a "
         f"common fraction in lowest terms.")
    s = f"With the common denominator {b * d}: ({a * d} + {c * b}) / {b * d}, which " \
        f"simplifies to {answer}."
    return q, s, answer


TEMPLATES: list[Callable[[np.random.Generator], Problem]] = [
    buy_and_give, boxes, share, shopping, linear, percent, rectangle, average, travel,
    unknown_days, remainder, squares, fractions]


def generate(seed: int, count: int) -> list[dict[str, str]]:
    """``count`` rows with distinct questions."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, str]] = []
    seen: set[str] = set()
    while len(rows) < count:
        template = TEMPLATES[_int(rng, 0, len(TEMPLATES) - 1)]
        query, steps, answer = template(rng)
        if query in seen:
            continue
        seen.add(query)
        rows.append({"query": query, "response": f"{steps} The answer is: {answer}",
                     "type": f"synthetic_{template.__name__}"})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--count", type=int, default=1500)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows = generate(args.seed, args.count)
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    args.out.write_text(text, encoding="utf-8")
    logger.info("wrote %d rows to %s", len(rows), args.out)


if __name__ == "__main__":
    main()
