"""SkyRL-gym through turnpool: its offline math envs (SkyRL-gym has seven ids; the others need
a database, a search server or test cases) play as in SkyRL-gym's own loop (make with the
task row as extras, init, step) for many seeds and answers, given rows and generated ones,
and the same on the sequential and process backends."""

from __future__ import annotations

import skyrl_gym

import turnpool
from tests.envs.hubs.parity import Record, play_make, play_pool, record
from turnpool.envs.hubs.skyrl import GENERATED, generated_row

IDS = sorted(GENERATED)
ANSWERS = ("I think #### 12", "Answer: 1007", "#### 1007", "no answer at all", "#### 3")
ROWS = [{"prompt": [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": f"What is {n} squared?"}],
         "reward_spec": {"ground_truth": str(n * n)},
         "reward_model": {"ground_truth": str(n * n)}, "extra_info": {"max_turns": 3}}
        for n in (3, 4, 5)]


def library_loop(env_id: str, row: dict, actions: list[str]) -> tuple[str, list[Record]]:
    env = skyrl_gym.make(env_id, env_config=None, extras=row)
    messages, _ = env.init(row["prompt"])
    steps: list[Record] = []
    for action in actions:
        out = env.step(action)
        info = {**out["metadata"], "messages": out["observations"]}
        text = "\n\n".join(m["content"] for m in out["observations"])
        steps.append(record(text, out["reward"], out["done"], False, info, library=True))
        if out["done"]:
            break
    env.close()
    return "\n\n".join(m["content"] for m in messages), steps


def answers_for(seed: int) -> list[str]:
    truth = generated_row("gsm8k", seed)["reward_spec"]["ground_truth"]
    right = [f"#### {truth}", f"Answer: {truth}"]
    return [ANSWERS[(seed + k) % len(ANSWERS)] for k in range(3)] + right


def test_generated_tasks_play_as_in_skyrl_gyms_own_loop() -> None:
    solved = 0
    for env_id in IDS:
        for seed in range(8):
            actions = answers_for(seed)
            ours = play_make(f"skyrl:{env_id}", seed, actions)
            assert ours == library_loop(env_id, generated_row(env_id, seed), actions), env_id
            solved += ours[1][-1][1] == 1.0
    assert solved >= 8  # the right answers are scored right


def test_given_rows_play_as_in_skyrl_gyms_own_loop_row_by_seed() -> None:
    for env_id in IDS:
        for seed in range(6):
            actions = ["#### 9", "Answer: 16", "#### 25"]
            ours = play_make(f"skyrl:{env_id}", seed, actions, tasks=ROWS)
            assert ours == library_loop(env_id, ROWS[seed % len(ROWS)], actions), env_id


def test_the_sequential_and_process_backends_play_the_same_episodes() -> None:
    names = [f"skyrl:{i}" for i in IDS for _ in range(3)]
    actions = {name: answers_for(k) for k, name in enumerate(dict.fromkeys(names))}
    unique = list(dict.fromkeys(names))
    sequential = play_pool(unique, 2, actions, "sequential")
    process = play_pool(unique, 2, actions, "process", num_workers=2)
    assert sequential == process
    assert sequential[unique[0]] == play_make(unique[0], 2, actions[unique[0]])


def test_an_id_that_needs_data_says_so_in_one_line() -> None:
    try:
        turnpool.make("skyrl:text2sql")
    except ValueError as exc:
        assert "needs tasks=" in str(exc)
    else:
        raise AssertionError("text2sql built without tasks")
