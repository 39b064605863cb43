"""turnpool's bundled verifiers environments: procedurally generated tasksets written with
verifiers' own v1 API (`vf.Taskset` of `vf.Task` rows, scored by ``@vf.reward`` methods).

verifiers 0.4.0 ships no offline taskset of its own (its TextArena taskset downloads NLTK
data; harbor, nemo_gym and openenv reach services), so these are what ``verifiers:<id>``
names out of the box. Each id is a family and a level (``add-easy``, ``reverse-hard``): the
family makes one row (a prompt, the exact answer) from a `random.Random`, the level sets the
sizes. A taskset is seeded by its config (``seed``) and holds ``size`` rows.

Rewards are verifiers' ordinary shape: an ``async`` method of the task reading
``trace.last_reply`` (the model's final reply, stripped), returning a float in [0, 1].
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import verifiers.v1 as vf

Row = tuple[str, str]

#: How many rows a taskset holds unless its config says otherwise.
DEFAULT_SIZE = 64


def _word(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n))


def _add(rng: random.Random, n: int) -> Row:
    a, b = rng.randrange(10**n), rng.randrange(10**n)
    return f"What is {a} + {b}? Reply with the number only.", str(a + b)


def _sub(rng: random.Random, n: int) -> Row:
    a, b = rng.randrange(10**n), rng.randrange(10**n)
    return f"What is {a} - {b}? Reply with the number only.", str(a - b)


def _mul(rng: random.Random, n: int) -> Row:
    a, b = rng.randrange(10**n), rng.randrange(10**n)
    return f"What is {a} * {b}? Reply with the number only.", str(a * b)


def _reverse(rng: random.Random, n: int) -> Row:
    w = _word(rng, 3 * n)
    return f"Reverse the string '{w}'. Reply with the reversed string only.", w[::-1]


def _count(rng: random.Random, n: int) -> Row:
    w, c = _word(rng, 6 * n), rng.choice("aeiou")
    return (f"How many times does the letter '{c}' occur in '{w}'? Reply with the number "
            "only.", str(w.count(c)))


def _sort(rng: random.Random, n: int) -> Row:
    xs = [rng.randrange(100) for _ in range(2 + 2 * n)]
    return (f"Sort these numbers ascending: {' '.join(map(str, xs))}. Reply with the sorted "
            "numbers separated by single spaces.", " ".join(map(str, sorted(xs))))


def _max(rng: random.Random, n: int) -> Row:
    xs = [rng.randrange(1000) for _ in range(2 + 3 * n)]
    return f"Which is the largest of {', '.join(map(str, xs))}? Reply with it only.", \
        str(max(xs))


def _length(rng: random.Random, n: int) -> Row:
    w = _word(rng, rng.randint(2 * n, 5 * n))
    return f"How many letters does '{w}' have? Reply with the number only.", str(len(w))


def _upper(rng: random.Random, n: int) -> Row:
    w = " ".join(_word(rng, rng.randint(2, 6)) for _ in range(n + 1))
    return f"Write '{w}' in upper case. Reply with it only.", w.upper()


def _parity(rng: random.Random, n: int) -> Row:
    x = rng.randrange(10 ** (2 * n))
    return f"Is {x} even or odd? Reply with 'even' or 'odd' only.", \
        "even" if x % 2 == 0 else "odd"


#: family -> row maker; every family has the levels of `LEVELS`.
FAMILIES: dict[str, Callable[[random.Random, int], Row]] = {
    "add": _add, "sub": _sub, "mul": _mul, "reverse": _reverse, "count": _count,
    "sort": _sort, "max": _max, "length": _length, "upper": _upper, "parity": _parity}
#: level -> size parameter of the row makers
LEVELS = {"easy": 1, "hard": 3}


class ArithmeticData(vf.TaskData):
    """One row: verifiers' task data (prompt, system prompt) and the exact answer."""

    answer: str


class ExactAnswerTask(vf.Task[ArithmeticData, vf.State, vf.TaskConfig]):
    """A row scored by exact match of the final reply (case and outer spaces ignored)."""

    @vf.reward
    async def exact(self, task: ArithmeticData, trace: vf.Trace) -> float:
        return float(trace.last_reply.lower() == task.answer.lower())


class GeneratedConfig(vf.TasksetConfig):
    """Which family and level, how many rows, and the seed of the rows."""

    family: str = "add"
    level: str = "easy"
    size: int = DEFAULT_SIZE
    seed: int = 0


class GeneratedTaskset(vf.Taskset[ExactAnswerTask, GeneratedConfig]):
    """``size`` rows of one family and level, drawn from ``random.Random(seed)``."""

    def load(self) -> Iterator[ExactAnswerTask]:
        make_row, n = FAMILIES[self.config.family], LEVELS[self.config.level]
        rng = random.Random(f"{self.config.family}-{self.config.level}-{self.config.seed}")
        for i in range(self.config.size):
            prompt, answer = make_row(rng, n)
            yield ExactAnswerTask(ArithmeticData(
                name=f"{self.config.family}-{self.config.level}#{i}", prompt=prompt,
                answer=answer), self.config.task)


#: Every bundled id: ``<family>-<level>``.
ENV_IDS = tuple(f"{f}-{lvl}" for f in FAMILIES for lvl in LEVELS)


def taskset(env_id: str, *, seed: int, size: int = DEFAULT_SIZE) -> GeneratedTaskset:
    """The bundled taskset of ``env_id`` (`KeyError` for an unknown id)."""
    family, _, level = env_id.rpartition("-")
    if family not in FAMILIES or level not in LEVELS:
        raise KeyError(env_id)
    return GeneratedTaskset(GeneratedConfig(id=f"turnpool-{env_id}", family=family,
                                            level=level, size=size, seed=seed))
