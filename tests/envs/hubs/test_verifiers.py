"""verifiers (v1) tasksets through turnpool: the prompts and rewards of verifiers' own loop
(iterate the taskset, score a trace of the reply with `Task.score`), on every bundled id, and
the same on the sequential and process backends."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
import verifiers.v1 as vf
from verifiers.v1.agent import Segment
from verifiers.v1.trace import AgentInfo, Trace, TraceTask
from verifiers.v1.types import AssistantMessage

import turnpool
from tests.envs.hubs.parity import play_make, play_pool, record
from turnpool.envs.hubs.verifiers import MULTI_TURN, VerifiersEnv
from turnpool.envs.hubs.verifiers_guess import GuessConfig, GuessEnv, GuessTaskset
from turnpool.envs.hubs.verifiers_tasks import GeneratedConfig, GeneratedTaskset

SIZE = 5
NAMES = [f"verifiers:{i}" for i in VerifiersEnv.env_ids() if i not in MULTI_TURN]
GUESSES = ["8", "4", "twelve", "12", "2", "14", "16", "1", "3", "5"]
BASE_SEED = 3  # seeds 3..22: tasksets seeded 0..4, rows 0..4 of each


def rows(name: str, seed: int) -> list[vf.Task]:
    family, _, level = name.split(":", 1)[1].rpartition("-")
    config = GeneratedConfig(id="t", family=family, level=level, size=SIZE, seed=seed // SIZE)
    return list(GeneratedTaskset(config))


def answers(name: str, seed: int) -> list[str]:
    """The exact answer for even seeds (in upper case: the match ignores case), a wrong one
    for odd seeds."""
    task = rows(name, seed)[seed % SIZE]
    return [f"  {task.data.answer.upper()} "] if seed % 2 == 0 else ["no idea"]


def library_loop(name: str, seed: int, reply: str) -> tuple[str, list[tuple]]:
    """verifiers' own scoring of one reply: a trace of the task with that reply, scored."""
    task = rows(name, seed)[seed % SIZE]
    trace = Trace(task=TraceTask(type=type(task).__name__, data=task.data),
                  agent=AgentInfo(config=vf.AgentConfig()), root_reply=reply)
    asyncio.run(task.score(trace))
    named = {k: r.score for k, r in trace.rewards.items() if r is not None}
    prompt = task.data.prompt_text
    return prompt, [record(prompt, trace.reward, True, False, {"rewards": named}, library=True)]


def test_there_are_twenty_bundled_ids() -> None:
    assert len(NAMES) >= 20 and len(VerifiersEnv.env_ids()) == len(NAMES) + 2


class ScriptedSeat:
    """A seat of verifiers' `Env.run` replying from a list, under a real event loop: the
    library's own loop, with the model side scripted. Records what the env said."""

    def __init__(self, replies: list[str], trace: Trace) -> None:
        self.replies, self.trace, self.heard = list(replies), trace, []

    def __getattr__(self, name: str) -> ScriptedSeat:
        return self

    @contextlib.asynccontextmanager
    async def interaction(self, task: vf.Task) -> AsyncIterator[ScriptedSeat]:
        yield self

    async def turn(self, message: str | None = None) -> Segment:
        await asyncio.sleep(0)
        self.heard.append(message)
        if not self.replies:
            return Segment(messages=[], terminated=True)
        reply = self.replies.pop(0)
        self.trace.root_reply = reply
        return Segment(messages=[AssistantMessage(content=reply)])


def guess_library_loop(level: str, seed: int, replies: list[str]) -> tuple[str, list[tuple]]:
    task = list(GuessTaskset(GuessConfig(id="g", level=level, size=SIZE, seed=seed // SIZE)))[
        seed % SIZE]
    trace = Trace(task=TraceTask(type=type(task).__name__, data=task.data),
                  agent=AgentInfo(config=vf.AgentConfig()))
    seat = ScriptedSeat(replies, trace)
    asyncio.run(object.__new__(GuessEnv).run(task, seat))
    asyncio.run(task.score(trace))
    steps = [record(m, 0.0, False, False, {}, library=True) for m in seat.heard[1:]]
    named = {k: r.score for k, r in trace.rewards.items() if r is not None}
    last = replies[len(steps)]
    steps.append(record(last, trace.reward, True, False,
                        {"rewards": named, "trace_info": dict(trace.info)}, library=True))
    return task.data.prompt_text, steps


def test_the_guessing_game_plays_as_verifiers_own_env_run() -> None:
    found = 0
    for level in ("easy", "hard"):
        for seed in range(12):
            replies = GUESSES[seed % 3:] + ["7", "9", "10", "11", "13", "15"]
            ours = play_make(f"verifiers:guess-{level}", seed, replies, size=SIZE)
            assert ours == guess_library_loop(level, seed, replies), (level, seed)
            assert len(ours[1]) <= 8
            found += ours[1][-1][1] == 1.0
    assert 0 < found < 24  # some games found, some not


def test_every_id_asks_and_scores_as_verifiers_does() -> None:
    full = 0
    for k, name in enumerate(NAMES):
        seed = BASE_SEED + k
        action = answers(name, seed)[0]
        ours = play_make(name, seed, [action], size=SIZE)
        assert ours == library_loop(name, seed, action), name
        full += ours[1][0][1] == 1.0
    assert full == len(NAMES) // 2  # exact answers score 1, wrong ones 0


def test_success_and_the_end_after_one_reply() -> None:
    env = turnpool.make("verifiers:reverse-easy", size=SIZE)
    obs, info = env.reset(seed=2)
    assert info["task_name"] == "reverse-easy#2" and "Reverse the string" in obs
    gold = rows("verifiers:reverse-easy", 2)[2].data.answer
    _, reward, terminated, _, info = env.step(gold)
    assert (reward, terminated, info["success"], info["rewards"]) == \
        (1.0, True, True, {"exact": 1.0})
    again = env.step(gold)
    assert again[4]["action_is_valid"] is False and again[1] == 0.0


def test_an_oversized_or_non_text_reply_is_invalid_without_scoring() -> None:
    env = turnpool.make("verifiers:add-easy", max_action_chars=10)
    env.reset(seed=0)
    for action in ("1" * 11, 3, None):
        _, reward, terminated, _, info = env.step(action)
        assert (reward, terminated, info["action_is_valid"]) == (0.0, False, False)


def test_a_taskset_class_by_entry_point_and_an_unknown_id() -> None:
    name = "verifiers:turnpool.envs.hubs.verifiers_tasks:GeneratedTaskset"
    env = turnpool.make(name, family="sort", level="hard", size=SIZE)
    obs, _ = env.reset(seed=SIZE + 1)  # row 1 of the taskset seeded 0 (its config's seed)
    config = GeneratedConfig(id="t", family="sort", level="hard", size=SIZE)
    assert obs == list(GeneratedTaskset(config))[1].data.prompt_text
    with pytest.raises(KeyError, match="turnpool envs --hub verifiers"):
        turnpool.make("verifiers:no-such-env")


def test_the_sequential_and_process_backends_play_the_same_episodes() -> None:
    names = [*NAMES, "verifiers:guess-easy", "verifiers:guess-hard"]
    actions = {name: answers(name, BASE_SEED + k) for k, name in enumerate(NAMES)}
    actions.update({n: GUESSES for n in names[len(NAMES):]})
    sequential = play_pool(names, BASE_SEED, actions, "sequential", {"size": SIZE})
    process = play_pool(names, BASE_SEED, actions, "process", {"size": SIZE}, num_workers=2)
    assert sequential == process
    for k, name in enumerate(NAMES):
        assert sequential[name] == library_loop(name, BASE_SEED + k, actions[name][0])
    for k, level in ((len(NAMES), "easy"), (len(NAMES) + 1, "hard")):
        assert sequential[f"verifiers:guess-{level}"] == \
            guess_library_loop(level, BASE_SEED + k, GUESSES)


def test_an_env_stepped_from_async_code_scores_as_from_sync_code() -> None:
    """Serving steps envs from a running event loop: scoring then runs on a loop of its own."""
    env = turnpool.make("verifiers:add-easy", size=SIZE)
    env.reset(seed=2)
    gold = rows("verifiers:add-easy", 2)[2].data.answer

    async def step() -> tuple:
        return env.step(gold)

    assert asyncio.run(step())[1:3] == (1.0, True)
    guess = turnpool.make("verifiers:guess-easy", size=SIZE)
    guess.reset(seed=0)
    secret = list(GuessTaskset(GuessConfig(id="g", size=SIZE)))[0].data.secret

    async def find() -> tuple:
        return guess.step(str(secret))

    assert asyncio.run(find())[1:3] == (1.0, True)
