"""A multi-turn verifiers environment bundled with turnpool: guess the number.

Written with verifiers' own v1 API: a `vf.Taskset` of rows (a secret number, its range, how
many guesses), and a `vf.Env` whose ``run`` plays the task with the ``player`` seat turn by
turn, answering each guess with "higher" or "lower", and records the reward on the trace
(1.0 for a found number). The module is a verifiers taskset plugin: its id is this module's
import path, and verifiers pairs the module's `Env` subclass with it.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from typing import Any

import verifiers.v1 as vf

#: level -> (largest secret, guesses allowed)
LEVELS = {"easy": (16, 6), "hard": (100, 8)}
_NUMBER = re.compile(r"-?\d{1,6}")


class GuessData(vf.TaskData):
    secret: int
    high: int
    max_guesses: int


class GuessTask(vf.Task[GuessData, vf.State, vf.TaskConfig]):
    pass


class GuessConfig(vf.TasksetConfig):
    level: str = "easy"
    size: int = 64
    seed: int = 0


class GuessTaskset(vf.Taskset[GuessTask, GuessConfig]):
    def load(self) -> Iterator[GuessTask]:
        high, guesses = LEVELS[self.config.level]
        rng = random.Random(f"guess-{self.config.level}-{self.config.seed}")
        for i in range(self.config.size):
            yield GuessTask(GuessData(
                name=f"guess-{self.config.level}#{i}", secret=rng.randint(1, high), high=high,
                max_guesses=guesses,
                prompt=(f"I picked a whole number from 1 to {high}. Guess it: reply with one "
                        f"number. You have {guesses} guesses.")), self.config.task)


def reply_number(reply: str) -> int | None:
    """The first number in a reply (its first 200 characters), or None."""
    found = _NUMBER.search(reply[:200])
    return int(found.group()) if found else None


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class GuessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task: Any, agents: Any) -> None:
        data, found, guesses = task.data, False, 0
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            while not segment.terminated:
                guesses += 1
                guess = reply_number(segment.last_reply)
                found = guess == data.secret
                if found or guesses >= data.max_guesses:
                    break
                hint = "not a number" if guess is None else \
                    "higher" if guess < data.secret else "lower"
                segment = await interaction.turn(f"{hint}. Guess again.")
        trace = interaction.trace
        trace.record_reward("found", 1.0 if found else 0.0)
        trace.info["guesses"] = guesses
