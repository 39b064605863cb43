"""DeepCoder: RAGEN v2's rewards on recorded (problem, reply) cases, its multi-turn feedback,
its data formats, and the one-line error for missing data."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import turnpool
from turnpool.envs.deepcoder import DeepCoderEnv, _Shared, assemble, load_problems, run_reply
from turnpool.sandbox import Sandbox

RECORDED = json.loads((Path(__file__).parent / "deepcoder_ragen_v2_rewards.json").read_text())
SUM = "n = int(input())\na = list(map(int, input().split()))\n"


@pytest.fixture(scope="module")
def box() -> Iterator[Sandbox]:
    with Sandbox() as sandbox:
        yield sandbox


@pytest.mark.parametrize("case", RECORDED["cases"], ids=lambda c: c["name"])
def test_rewards_equal_ragen_v2s_on_recorded_replies(box: Sandbox, case: dict) -> None:
    problem = load_problems({})[case["problem_index"]]
    correct, detail, passed, total, runnable, _ = run_reply(box, case["reply"], problem)
    assert (passed / total, correct, passed, total, runnable) == (
        case["reward"], case["is_correct"], case["passed_tests"], case["total_tests"],
        case["runnable"])
    if "detail" in case:
        assert detail == case["detail"]
    else:
        assert detail.startswith(case["detail_prefix"])


def test_the_bundled_set_has_over_two_hundred_problems_with_tests() -> None:
    problems = load_problems({})
    assert len(problems) >= 200
    assert all(p["tests"] for p in problems)
    assert {p["func_name"] is None for p in problems} == {True, False}


def test_a_failed_attempt_shows_the_problem_with_ragens_feedback() -> None:
    env = turnpool.make("deepcoder", max_steps=2)
    try:
        env.reset(seed=1)
        env.index = 0  # the "sum modulo 7" problem
        obs, reward, done, _, info = env.step(SUM + "print(sum(a) % 7 if n < 5 else -1)")
        assert (reward, done) == (0.5, False)
        assert obs.endswith("Feedback: Passed 4/8 tests. Wrong answer on test 0: got -1 "
                            "expected 5")
        obs, reward, done, _, info = env.step(SUM + "print(sum(a) % 7)")
        assert (obs, reward, done, info["success"]) == ("Correct!", 1.0, True, True)
    finally:
        env.close()


def test_the_last_attempt_ends_the_episode_incorrect() -> None:
    env = DeepCoderEnv()
    try:
        env.reset(seed=1)
        env.index = 0
        obs, reward, done, _, info = env.step("print(-100)")
        assert (obs, reward, done, info["action_is_valid"]) == ("Incorrect.", 0.0, True, True)
    finally:
        env.close()


def test_an_empty_reply_is_invalid_and_costs_no_attempt() -> None:
    env = DeepCoderEnv()
    env.reset(seed=0)
    obs, reward, done, _, info = env.step("  \n")
    assert (reward, done, info["action_is_valid"]) == (0.0, False, False)
    assert obs.endswith("Feedback: Empty action") and env.step_num == 0


def test_the_problem_follows_the_seed_as_ragen_draws_it() -> None:
    env = DeepCoderEnv()
    import random
    for seed in (0, 5, 123):
        env.reset(seed=seed)
        assert env.index == random.Random(seed).randint(0, len(load_problems({})) - 1)


def test_a_reply_defining_a_method_is_indented_into_the_starter_class() -> None:
    starter = "class Solution:\n    pass"
    assert assemble("def f(self):\n    return 1", starter) == (
        "class Solution:\n    pass\n\n    def f(self):\n        return 1")
    assert assemble("class Solution:\n    x = 1", starter) == "class Solution:\n    x = 1"


def test_a_missing_data_file_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as err:
        DeepCoderEnv(data_path=str(tmp_path / "none.jsonl"))
    assert "\n" not in str(err.value) and "not a local file" in str(err.value)


def test_deepcoder_preview_rows_and_taco_tests_are_read(tmp_path: Path, box: Sandbox) -> None:
    rows = [{"problem": "echo", "tests": json.dumps({"inputs": ["a\n"], "outputs": ["a\n"]}),
             "metadata": "{}", "starter_code": ""},
            {"question": "twice", "ground_truth": [
                {"input": "3", "output": "6", "testtype": "functional"}],
             "metadata": {"func_name": "twice"}}]
    path = tmp_path / "dc.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    echo, twice = load_problems({"data_path": str(path)})
    assert run_reply(box, "print(input())", echo)[:3] == (True, "All tests passed.", 1)
    assert run_reply(box, "def twice(x):\n    return 2 * x", twice)[0]


def test_an_answer_never_enters_the_sandbox(box: Sandbox) -> None:
    problem = load_problems({})[0]
    spy = "import json\nprint(open('case.json').read())"
    _, detail, *_ = run_reply(box, spy, problem)
    answer = problem["tests"][0]["output"].strip()
    assert detail.startswith('Passed 0/8 tests. Wrong answer on test 0: got {"code"')
    assert '"output"' not in detail and f"expected {answer}" in detail


def test_closing_the_last_env_stops_the_shared_sandbox() -> None:
    env = DeepCoderEnv()
    env.reset(seed=0)
    env.index = 0
    env.step("print(1)")
    box = _Shared.box
    assert box is not None and box.server_pid is not None
    env.close()
    env.close()  # idempotent
    assert _Shared.box is None and box.server_pid is None


@pytest.mark.parametrize("reply", [
    # 1 GiB straight to the process's stdout (the sandbox stops it at its output limit)
    "import os\nfor _ in range(1024):\n    os.write(1, b'x' * (1 << 20))\n",
    # a wrong answer of 256 KiB per test, and an exception whose message is 256 KiB
    "print('y' * (1 << 18))\n",
    "raise ValueError('z' * (1 << 18))\n",
])
def test_a_flood_of_output_leaves_obs_and_info_a_few_kb(reply: str) -> None:
    env = DeepCoderEnv(max_steps=2)
    try:
        env.reset(seed=1)
        env.index = 0  # a stdin/stdout problem
        obs, reward, done, _, info = env.step(reply)
        assert (reward, done, info["success"]) == (0.0, False, False)
        assert "[cut " in info["detail"] and "[cut " in obs
        assert len(obs) + len(json.dumps(info)) < 64 << 10
    finally:
        env.close()


def test_a_function_problem_shows_its_starter_code_as_ragen_v2_asks() -> None:
    problems = load_problems({})
    functions = [p for p in problems if p["starter_code"]]
    assert len(functions) == 72
    env = DeepCoderEnv()
    try:
        for seed in range(40):
            obs, _ = env.reset(seed=seed)
            problem = env.problem
            if not problem["starter_code"]:
                assert "Starter code:" not in obs
                continue
            # RAGEN v2: the problem, a blank line, "Starter code:" and the code
            head, sep, code = obs.partition("\n\nStarter code:\n")
            assert sep and code == problem["starter_code"] and head
            assert f"def {problem['func_name']}(" in obs  # the method the tests call
            break
        else:
            pytest.fail("no function problem in the first 40 seeds")
    finally:
        env.close()


def test_a_prepared_question_is_shown_as_is(tmp_path: Path) -> None:
    row = {"question": "Q", "starter_code": "class Solution:\n    def f(self): pass",
           "ground_truth": json.dumps([{"input": "", "output": "1", "testtype": "stdin"}])}
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n", encoding="utf-8")
    assert load_problems({"data_path": str(path)})[0]["prompt"] == "Q"
