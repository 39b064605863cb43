"""Countdown: bundled puzzles, the solver, scoring, data loading and env semantics."""

from __future__ import annotations

import itertools
import json
import os
import pickle
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import turnpool
from turnpool.envs.countdown import (
    CountdownEnv,
    load_puzzles,
    oracle,
    puzzle_text,
    score_expression,
    solve,
)
from turnpool.envs.safe_math import evaluate

pytestmark = pytest.mark.timeout(120)


def test_every_bundled_puzzle_is_solved_by_the_solver() -> None:
    puzzles = load_puzzles()
    assert len(puzzles) >= 2000
    assert len(set(puzzles)) == len(puzzles)
    for target, nums in puzzles:
        assert 3 <= len(nums) <= 4
        answer = solve(target, nums)
        assert answer is not None, (target, nums)
        assert score_expression(answer, target, nums) == (1.0, True), (target, nums, answer)


def _reachable(values: list[Fraction]) -> set[Fraction]:
    """Brute force: every value some expression over all of ``values`` can take."""
    if len(values) == 1:
        return {values[0]}
    out: set[Fraction] = set()
    for i, j in itertools.combinations(range(len(values)), 2):
        a, b = values[i], values[j]
        rest = [v for k, v in enumerate(values) if k not in (i, j)]
        results = [a + b, a - b, b - a, a * b] + ([a / b] if b else []) + ([b / a] if a else [])
        for r in results:
            out |= _reachable([*rest, r])
    return out


def test_solver_agrees_with_brute_force() -> None:
    rng = np.random.default_rng(5)
    for _ in range(60):
        nums = [int(n) for n in rng.integers(1, 14, size=int(rng.integers(2, 5)))]
        target = int(rng.integers(1, 40))
        reachable = Fraction(target) in _reachable([Fraction(n) for n in nums])
        answer = solve(target, nums)
        assert (answer is not None) == reachable, (target, nums)
        if answer is not None:
            assert score_expression(answer, target, nums)[0] == 1.0


def test_solver_needs_multiplication_and_division() -> None:
    assert solve(24, [3, 3, 8, 8]) == "8 / (3 - (8 / 3))"  # only a fractional route exists
    answer = solve(30, [5, 6, 1])
    assert answer is not None and evaluate(answer).value == 30
    assert solve(1000, [1, 2, 3]) is None
    assert solve(5, [5]) == "5" and solve(4, [5]) is None
    assert solve(3, []) is None


@pytest.mark.parametrize(("answer", "expected"), [
    ("(7 - 8 / 8) * 4", (1.0, True)),
    ("4 * (7 - 8 / 8)", (1.0, True)),
    ("7 + 8 + 8 + 4", (0.1, True)),       # right numbers, wrong value
    ("(7 - 8 / 8) * 4 * 1", (0.0, True)),  # extra number
    ("(7 - 8) * 4", (0.0, True)),          # a number missing
    ("(7 - 8 / 8) * 5", (0.0, True)),      # a wrong number
    ("7 8 8 4", (0.1, False)),             # digits right, not an expression (RAGEN: 0.1)
    ("(7 - 8 / (8 - 8)) * 4", (0.0, False)),
    ("24", (0.0, True)),
    ("__import__('os')", (0.0, False)),
    ("9**9**9**9", (0.0, False)),
    ("(" * 100_000, (0.0, False)),
    ("7" * 1_000_000, (0.0, False)),
    (None, (0.0, False)),
])
def test_scoring(answer: object, expected: tuple[float, bool]) -> None:
    assert score_expression(answer, 24, [4, 7, 8, 8]) == expected


def test_reset_is_a_function_of_the_seed() -> None:
    a, b = CountdownEnv(), turnpool.make("countdown")
    puzzles = load_puzzles()
    for seed in (0, 1, 17, len(puzzles) + 3, 10_000):
        obs_a, info = a.reset(seed=seed)
        obs_b, _ = b.reset(seed=seed)
        assert obs_a == obs_b == puzzle_text(*puzzles[seed % len(puzzles)])
        assert obs_a.startswith("Target: ") and ", nums: [" in obs_a
        assert info["anchor_obs"] == obs_a and not info["success"]


def test_step_rewards_and_info() -> None:
    env = CountdownEnv()
    obs, _ = env.reset(seed=3)
    target, nums = env.puzzle
    answer = oracle(obs, {})[0]
    obs2, reward, terminated, truncated, info = env.step(answer)
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["success"] and info["action_is_valid"] and info["action_is_effective"]
    assert obs2 == "Your answer get 1 points."  # RAGEN's text; the score stays an int
    # The episode is over: a further step changes nothing and pays nothing.
    assert env.step(answer)[1:3] == (0.0, True)

    env.reset(seed=3)
    wrong_value = " + ".join(map(str, nums)) if sum(nums) != target else " * ".join(map(str, nums))
    _, reward, terminated, _, info = env.step(wrong_value)
    assert (reward, terminated) == (0.1, True)
    assert info["action_is_valid"] and info["action_is_effective"] and not info["success"]

    env.reset(seed=3)
    _, reward, terminated, _, info = env.step("print(1)")
    assert (reward, terminated) == (0.0, True)
    # RAGEN: any text is a valid action; the reward judges it
    assert info["action_is_valid"] and not info["action_is_effective"]


def test_oracle_solves_every_seed_it_is_given() -> None:
    env = CountdownEnv()
    for seed in range(40):
        obs, _ = env.reset(seed=seed)
        assert env.step(oracle(obs, {})[0])[1] == 1.0
    assert oracle("not a puzzle", {}) == []
    assert oracle("Target: 1000, nums: [1, 2, 3]", {}) == []


def test_instances_share_one_table_and_snapshots_exclude_it() -> None:
    a, b = CountdownEnv(), CountdownEnv(max_expression_chars=100)
    assert a.puzzles is b.puzzles
    a.reset(seed=11)
    state = a.get_state()
    assert len(pickle.dumps(state)) < 4000
    b.set_state(state)
    assert b.render() == a.render() and b.puzzle == a.puzzle


def _write_rows(path: Path, rows: list[dict[str, object]]) -> Path:
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows))
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


USER_ROWS: list[dict[str, object]] = [
    {"target": 24, "nums": [4, 7, 8, 8]},
    {"target": 1000, "nums": [1, 2, 3]},          # unsolvable: dropped
    {"target": 10, "nums": [2, 5]},
    {"target": 7, "nums": None},                  # malformed: dropped
    {"target": 6, "nums": [1, 2, 3]},
]


@pytest.mark.parametrize("name", ["puzzles.jsonl", "puzzles.json", "puzzles.parquet"])
def test_user_files_are_read_and_filtered(tmp_path: Path, name: str) -> None:
    path = _write_rows(tmp_path / name, USER_ROWS)
    # RAGEN's filter keeps rows some +-a +-b +-c +-d solves
    assert CountdownEnv(data_path=str(path)).puzzles == ((6, (1, 2, 3)),)
    env = CountdownEnv(data_path=str(path), require_solution="any")
    assert env.puzzles == ((24, (4, 7, 8, 8)), (10, (2, 5)), (6, (1, 2, 3)))
    assert env.reset(seed=4)[0] == "Target: 10, nums: [2, 5]"  # 4 % 3 == 1
    assert CountdownEnv(train_path=str(path), require_solution="any").puzzles is env.puzzles
    unfiltered = CountdownEnv(data_path=str(path), require_solution=False, max_instances=2)
    assert unfiltered.puzzles == ((24, (4, 7, 8, 8)), (1000, (1, 2, 3)))


def test_user_file_is_read_once_per_process(tmp_path: Path, dataset_reads: list[Path]) -> None:
    path = _write_rows(tmp_path / "once.jsonl", USER_ROWS)
    envs = [CountdownEnv(data_path=path) for _ in range(5)]
    for seed, env in enumerate(envs):
        env.reset(seed=seed)
        env.step("1 + 1")
    assert len(dataset_reads) == 1
    assert all(env.puzzles is envs[0].puzzles for env in envs)


def test_bad_paths_and_empty_files_fail_at_construction(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        CountdownEnv(data_path=str(tmp_path / "missing.jsonl"))
    empty = _write_rows(tmp_path / "empty.jsonl", [{"target": 1000, "nums": [1, 2, 3]}])
    with pytest.raises(ValueError, match="no usable puzzles"):
        CountdownEnv(data_path=str(empty))


_DIGEST_SCRIPT = """
import hashlib, turnpool
h = hashlib.sha256()
for name, actions in (("countdown", ["1 + 2"]), ("frozen_lake", [2, 3, 2, 3, 1]),
                      ("bandit", ["dragon"]), ("metamathqa", ["7", "8"])):
    env = turnpool.make(name)
    for seed in range(25):
        h.update(repr(env.reset(seed=seed)).encode())
        for action in actions:
            h.update(repr(env.step(action)).encode())
print(h.hexdigest())
"""


def test_episodes_are_identical_across_processes_and_hash_seeds() -> None:
    digests = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run([sys.executable, "-c", _DIGEST_SCRIPT], env=env, check=True,
                             capture_output=True, text=True, timeout=60)
        digests.add(out.stdout.strip())
    assert len(digests) == 1


def test_ragens_default_train_path_is_read_from_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """RAGEN reads ``data/countdown/train.parquet`` when no path is set; so does turnpool
    (the bundled set only where that file is absent)."""
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    monkeypatch.chdir(tmp_path)
    assert "Target: 31, nums: [5, 2, 24]" in turnpool.make("countdown").reset(seed=0)[0]
    (tmp_path / "data" / "countdown").mkdir(parents=True)
    pq.write_table(pa.table({"target": [7, 9], "nums": [[3, 4], [4, 5]]}),
                   tmp_path / "data" / "countdown" / "train.parquet")
    assert "Target: 9, nums: [4, 5]" in turnpool.make("countdown").reset(seed=1)[0]
