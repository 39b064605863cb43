"""reasoning-gym through turnpool: every offline dataset, the same questions and scores as
reasoning-gym's own loop (create_dataset, item, score_answer), and the same on the sequential
and process backends."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import reasoning_gym as rg

import turnpool
from tests.envs.hubs.parity import play_make, play_pool, record
from turnpool.envs.hubs.rg import HASH_DEPENDENT, ReasoningGymEnv

ROOT = Path(__file__).resolve().parents[3]
SIZE = 7
#: needs a list of datasets to compose (no config runs it alone)
NOT_ALONE = {"composite"}
NAMES = [f"rg:{d}" for d in ReasoningGymEnv.env_ids() if d not in NOT_ALONE]
BASE_SEED = 12  # dataset seed 1 for the first seven ids, 2 after: two datasets per chunk


def answers(name: str, seed: int) -> list[str]:
    """The gold answer for even seeds, a wrong one for odd seeds (both paths of scoring)."""
    data = rg.create_dataset(name[3:], seed=seed // SIZE, size=SIZE)
    return [str(data[seed % SIZE]["answer"]) if seed % 2 == 0 else "no idea"]


def library_loop(name: str, seed: int, action: str) -> tuple[str, list[tuple]]:
    data = rg.create_dataset(name[3:], seed=seed // SIZE, size=SIZE)
    entry = data[seed % SIZE]
    score = data.score_answer(action, entry)
    return entry["question"], [record(entry["question"], score, True, False, {"score": score},
                                      library=True)]


def test_there_are_over_a_hundred_offline_datasets() -> None:
    assert len(NAMES) >= 100


def test_every_dataset_asks_and_scores_as_reasoning_gym_does() -> None:
    full = 0
    for k, name in enumerate(NAMES):
        seed = BASE_SEED + k
        action = answers(name, seed)[0]
        ours = play_make(name, seed, [action], size=SIZE)
        assert ours == library_loop(name, seed, action), name
        full += ours[1][0][1] == 1.0
    assert full >= len(NAMES) // 2 - 10  # gold answers score full marks (bar a few datasets)


def test_success_is_full_marks_and_the_episode_ends_after_one_answer() -> None:
    env = turnpool.make("rg:leg_counting", size=SIZE)
    env.reset(seed=4)
    gold = rg.create_dataset("leg_counting", seed=0, size=SIZE)[4]["answer"]
    _, reward, terminated, _, info = env.step(gold)
    assert (reward, terminated, info["success"], info["score"]) == (1.0, True, True, 1.0)
    again = env.step(gold)
    assert again[4]["action_is_valid"] is False and again[1] == 0.0


def test_an_oversized_or_non_text_answer_is_invalid_without_scoring() -> None:
    env = turnpool.make("rg:leg_counting", size=SIZE, max_action_chars=10)
    env.reset(seed=0)
    for action in ("1" * 11, 3, None):
        _, reward, terminated, _, info = env.step(action)
        assert (reward, terminated, info["action_is_valid"]) == (0.0, False, False)


def test_datasets_leave_the_callers_global_rng_alone() -> None:
    random.seed(5)
    expected = random.random()
    random.seed(5)
    env = turnpool.make("rg:pool_matrix", size=SIZE)  # its generator draws from `random`
    env.reset(seed=3)
    env.step("1")
    assert random.random() == expected


def backends_agree(names: list[str]) -> None:
    actions = {name: answers(name, BASE_SEED + k) for k, name in enumerate(names)}
    sequential = play_pool(names, BASE_SEED, actions, "sequential", {"size": SIZE})
    process = play_pool(names, BASE_SEED, actions, "process", {"size": SIZE}, num_workers=2)
    assert sequential == process
    first = names[0]
    assert sequential[first] == play_make(first, BASE_SEED, actions[first], size=SIZE)


def test_the_sequential_and_process_backends_play_the_same_episodes() -> None:
    backends_agree([n for n in NAMES if n[3:] not in HASH_DEPENDENT])


def test_hash_dependent_datasets_agree_across_processes_under_a_fixed_hash_seed() -> None:
    """Their items depend on the string hash: the same in every process once PYTHONHASHSEED
    is set (a child interpreter here, so that this process's hash seed plays no part)."""
    names = sorted(f"rg:{d}" for d in HASH_DEPENDENT)
    code = ("from tests.envs.hubs.test_rg import backends_agree; "
            f"backends_agree({names!r}); print('agree')")
    env = {**os.environ, "PYTHONHASHSEED": "3", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120, check=False, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("agree"), proc.stderr[-2000:]
