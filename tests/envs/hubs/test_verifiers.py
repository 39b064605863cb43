"""verifiers (v1) tasksets through turnpool: the prompts and rewards of verifiers' own loop
(iterate the taskset, score a trace of the reply with `Task.score`), on every bundled id, and
the same on the sequential and process backends."""

from __future__ import annotations

import asyncio

import pytest
import verifiers.v1 as vf
from verifiers.v1.trace import AgentInfo, Trace, TraceTask

import turnpool
from tests.envs.hubs.parity import play_make, play_pool, record
from turnpool.envs.hubs.verifiers import VerifiersEnv
from turnpool.envs.hubs.verifiers_tasks import GeneratedConfig, GeneratedTaskset

SIZE = 5
NAMES = [f"verifiers:{i}" for i in VerifiersEnv.env_ids()]
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
    assert len(NAMES) >= 20


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
    actions = {name: answers(name, BASE_SEED + k) for k, name in enumerate(NAMES)}
    sequential = play_pool(NAMES, BASE_SEED, actions, "sequential", {"size": SIZE})
    process = play_pool(NAMES, BASE_SEED, actions, "process", {"size": SIZE}, num_workers=2)
    assert sequential == process
    for k, name in enumerate(NAMES):
        assert sequential[name] == library_loop(name, BASE_SEED + k, actions[name][0])
