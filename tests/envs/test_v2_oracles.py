"""The oracles of RAGEN v2's Sudoku, 2x2 cube, 2048, SearchQA and DeepCoder envs: each reads
only the page (and the env's own data) and finishes the episode it is shown."""

from __future__ import annotations

import pytest

from turnpool.envs.deepcoder import DeepCoderEnv, answer_key
from turnpool.envs.deepcoder import oracle as deepcoder_oracle
from turnpool.envs.game_2048 import ACTIONS as MOVES_2048
from turnpool.envs.game_2048 import Game2048Env, read_board
from turnpool.envs.game_2048 import oracle as oracle_2048
from turnpool.envs.rubikscube import ACTIONS as TURNS
from turnpool.envs.rubikscube import RubiksCube2x2Env
from turnpool.envs.rubikscube import oracle as cube_oracle
from turnpool.envs.search_qa import SearchQAEnv
from turnpool.envs.search_qa import oracle as search_oracle
from turnpool.envs.sudoku import RENDER_FORMATS, SudokuEnv, allowed
from turnpool.envs.sudoku import oracle as sudoku_oracle

GARBAGE = ["", "Row 1: [2, 2]\nRow 2: [2]", "[1][2]\n" * 9, "x" * 10_000]


@pytest.mark.parametrize("fmt", RENDER_FORMATS)
@pytest.mark.parametrize("size", [4, 9, 16])
def test_sudoku_oracle_fills_the_grid(fmt: str, size: int) -> None:
    env = SudokuEnv(grid_size=size, render_format=fmt, max_steps=size * size)
    obs, _ = env.reset(seed=size)
    plan = sudoku_oracle(obs, {"grid_size": size})
    assert plan and len(plan) == sum(1 for row in env.initial for v in row if not v)
    for action in plan:
        obs, _, terminated, _, info = env.step(action)
        assert info["action_is_valid"], info
    assert terminated and info["success"]


def test_sudoku_oracle_overwrites_a_wrong_placement() -> None:
    env = SudokuEnv(grid_size=9)
    obs, _ = env.reset(seed=3)
    r, c, wrong = next((r, c, n) for r in range(9) for c in range(9) for n in range(1, 10)
                       if not env.current[r][c] and n != env.solution[r][c]
                       and allowed(env.current, r, c, n, 3))
    obs, _, _, _, info = env.step(f"place {wrong} at row {r + 1} col {c + 1}")
    assert info["action_is_valid"] and not info["correct_placement"]
    for action in sudoku_oracle(obs, {"grid_size": 9}):
        obs, _, terminated, _, info = env.step(action)
    assert terminated and info["success"]


@pytest.mark.parametrize("seed", range(6))
def test_cube_oracle_solves_the_scramble_in_at_most_its_depth(seed: int) -> None:
    env = RubiksCube2x2Env(scramble_depth=5)
    obs, _ = env.reset(seed=seed)
    plan = cube_oracle(obs, {})
    assert 0 < len(plan) <= 5
    ids = {name: a for a, name in TURNS.items()}
    for name in plan:
        obs, reward, terminated, _, info = env.step(ids[name])
    assert terminated and info["success"] and reward == 1.0
    assert cube_oracle(obs, {}) == []  # a finished page: nothing to turn


def test_2048_oracle_plays_a_move_that_changes_the_grid() -> None:
    env = Game2048Env()
    obs, _ = env.reset(seed=0)
    ids = {name: a for a, name in MOVES_2048.items()}
    for _ in range(50):
        (move,) = oracle_2048(obs, {})
        obs, _, _, _, info = env.step(ids[move])
        assert info["action_is_valid"] and read_board(obs) == env.board


def test_search_oracle_answers_the_question_and_nothing_else() -> None:
    env = SearchQAEnv(mock_mode=True)
    obs, _ = env.reset(seed=1)
    (action,) = search_oracle(obs, {})
    assert action.startswith("finish[")
    assert env.step(action)[4]["reward_metadata"]["exact_match"]
    assert search_oracle("Question: not in the data\n" + obs.splitlines()[-1], {}) == []


def test_deepcoder_oracle_passes_a_problem_and_keys_functional_tests() -> None:
    env = DeepCoderEnv()
    try:
        obs, _ = env.reset(seed=1)
        (code,) = deepcoder_oracle(obs, {})
        assert env.step(code)[4]["success"]
    finally:
        env.close()
    functional = {"tests": [{"input": "[1, 2]\n3", "output": "True", "testtype": "functional"}],
                  "func_name": "f", "starter_code": ""}
    code = answer_key(functional)
    assert code is not None and "class Solution" in code and "def f(" in code
    functional["tests"][0]["input"] = "(1, 2)"  # not JSON: no key, no eval
    assert answer_key(functional) is None


@pytest.mark.parametrize("text", GARBAGE)
def test_oracles_give_nothing_for_a_page_they_cannot_read(text: str) -> None:
    assert sudoku_oracle(text, {}) == []
    assert cube_oracle(text, {}) == []
    assert oracle_2048(text, {}) == []
    assert search_oracle(text, {}) == []
    assert deepcoder_oracle(text, {}) == []
