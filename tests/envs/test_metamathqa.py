"""MetaMathQA: bundled sample, answer matching, decaying retries, attempt limit, loaders."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

import turnpool
from turnpool.envs import datasets
from turnpool.envs.metamathqa import (
    CORRECT,
    INCORRECT,
    MetaMathQAEnv,
    answer_for,
    extract_answer,
    load_table,
    oracle,
)

pytestmark = pytest.mark.timeout(60)


def test_bundled_sample() -> None:
    table = load_table()
    assert 1000 <= len(table.questions) <= 2000
    assert len(set(table.questions)) == len(table.questions)
    assert all(answer.strip() for answer in table.answers)
    assert datasets.bundled_path("metamathqa_sample.jsonl").stat().st_size < 1_000_000


def test_reset_is_deterministic_and_varied() -> None:
    a, b = MetaMathQAEnv(), turnpool.make("metamathqa")
    questions = set()
    for seed in range(50):
        qa, info = a.reset(seed=seed)
        qb, _ = b.reset(seed=seed)
        assert qa == qb and info["anchor_obs"] == qa
        questions.add(qa)
    assert len(questions) > 40


def test_correct_answer_with_case_and_space_changes() -> None:
    env = MetaMathQAEnv()
    for seed in range(20):
        question, _ = env.reset(seed=seed)
        answer = answer_for(question)
        assert answer is not None
        messy = "  " + " ".join(answer.upper()) + "\n"
        obs, reward, terminated, truncated, info = env.step(messy)
        assert (obs, reward, terminated, truncated) == (CORRECT, 1.0, True, False)
        assert info["success"] and info["action_is_valid"]
        assert info["anchor_obs"] == question


def test_retries_earn_half_each_time_and_the_limit_truncates() -> None:
    env = MetaMathQAEnv()
    question, _ = env.reset(seed=3)
    answer = env.correct_answer
    obs, reward, terminated, truncated, info = env.step("definitely wrong")
    assert (obs, reward, terminated, truncated) == (INCORRECT, 0.0, False, False)
    assert info["action_is_valid"] and not info["success"]
    assert info["anchor_obs"] == question  # no attempt counter in the anchor
    env.step("still wrong")
    assert env.step(answer)[:3] == (CORRECT, 0.25, True)

    limited = MetaMathQAEnv(max_attempts=3)
    limited.reset(seed=3)
    results = [limited.step("wrong") for _ in range(3)]
    assert [r[3] for r in results] == [False, False, True]  # truncated on the 3rd miss
    assert not any(r[2] for r in results)
    assert limited.step(answer)[1:3] == (0.0, True)  # over: even the right answer pays nothing

    unlimited = turnpool.make("metamathqa")  # RAGEN's env (v1 and v2): no attempt limit
    unlimited.reset(seed=3)
    assert not any(unlimited.step("wrong")[3] for _ in range(10))
    assert unlimited.step(answer)[1] == pytest.approx(1 / 2**10)
    with pytest.raises(ValueError):
        MetaMathQAEnv(max_attempts=0)


@pytest.mark.parametrize("bad", ["", "   \n", None, 42, "9" * 1_000_000])
def test_empty_huge_or_non_text_answers_are_invalid_attempts(bad: object) -> None:
    env = MetaMathQAEnv()
    env.reset(seed=0)
    obs, reward, terminated, _, info = env.step(bad)
    assert (obs, reward, terminated) == (INCORRECT, 0.0, False)
    assert not info["action_is_valid"]
    assert env.attempt == 1


def test_answer_extraction() -> None:
    assert extract_answer("2 + 2 = 4. The answer is: 4") == "4"
    assert extract_answer("So x = 3.\nThe answer is: \\frac{1}{2}\n") == "\\frac{1}{2}"
    assert extract_answer("no marker here") is None
    assert extract_answer("The answer is:   ") is None


ROWS = [
    {"query": "What is 2 + 3?", "response": "2 + 3 = 5. The answer is: 5"},
    {"query": "Name the shape with 3 sides.", "response": "The answer is: Triangle"},
    {"query": "A row without an answer marker", "response": "It is 7."},
    {"query": "What is 10 / 4?", "response": "The answer is: 2.5", "type": "extra column"},
]


def _write(path: Path) -> Path:
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(ROWS), path)
    elif path.suffix == ".json":
        path.write_text(json.dumps(ROWS))
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


@pytest.mark.parametrize("name", ["qa.json", "qa.jsonl", "qa.parquet"])
def test_user_files(tmp_path: Path, name: str) -> None:
    path = _write(tmp_path / name)
    env = MetaMathQAEnv(data_path=str(path))
    assert env.table.questions == ("What is 2 + 3?", "Name the shape with 3 sides.",
                                   "What is 10 / 4?")
    assert MetaMathQAEnv(dataset_path=path).table is env.table  # RAGEN's key, same table
    seen = set()
    for seed in range(30):
        question, _ = env.reset(seed=seed)
        seen.add(question)
        assert oracle(question, {"data_path": str(path)}) == [env.correct_answer]
        if question == "Name the shape with 3 sides.":
            assert env.step("triangle")[1] == 1.0
    assert len(seen) == 3


def test_table_is_shared_and_not_in_snapshots(tmp_path: Path,
                                              dataset_reads: list[Path]) -> None:
    path = _write(tmp_path / "shared.jsonl")
    envs = [MetaMathQAEnv(data_path=path) for _ in range(4)]
    for seed, env in enumerate(envs):
        env.reset(seed=seed)
        env.step("5")
    assert len(dataset_reads) == 1
    assert all(env.table is envs[0].table for env in envs)

    bundled_a, bundled_b = MetaMathQAEnv(), MetaMathQAEnv()
    assert bundled_a.table is bundled_b.table
    bundled_a.reset(seed=9)
    bundled_a.step("wrong")
    state = bundled_a.get_state()
    assert len(pickle.dumps(state)) < 4000
    bundled_b.set_state(state)
    assert bundled_b.attempt == 1 and bundled_b.question == bundled_a.question
    assert bundled_b.step(bundled_a.correct_answer)[1] == 0.5


def test_oracle_on_unknown_text_and_missing_files(tmp_path: Path) -> None:
    assert oracle("What is the meaning of life?", {}) == []
    assert oracle(INCORRECT, {}) == []
    with pytest.raises(FileNotFoundError):
        MetaMathQAEnv(data_path=tmp_path / "nope.json")
    with pytest.raises(FileNotFoundError):
        MetaMathQAEnv(dataset_path="meta-math/MetaMathQA")  # a hub name is not a local file


def test_a_dataset_folder_is_read_for_the_split_as_ragens_load_dataset_names_it(
        tmp_path: Path) -> None:
    """RAGEN passes ``dataset_path`` to ``datasets.load_dataset``, which reads a local folder
    and names each split by its file; turnpool reads the file of the env's split."""
    def rows(question: str) -> str:
        return json.dumps({"query": question, "response": "So. The answer is: 3"}) + "\n"

    folder = tmp_path / "mm"
    folder.mkdir()
    (folder / "train.jsonl").write_text(rows("train question"), encoding="utf-8")
    (folder / "test-00000-of-00001.jsonl").write_text(rows("test question"), encoding="utf-8")
    (folder / "notes.txt").write_text("not data", encoding="utf-8")
    assert MetaMathQAEnv(dataset_path=folder).reset(seed=0)[0] == "train question"
    assert MetaMathQAEnv(dataset_path=folder, split="test").reset(seed=0)[0] == "test question"
    with pytest.raises(FileNotFoundError, match="split 'validation'"):
        MetaMathQAEnv(dataset_path=folder, split="validation")
    single = tmp_path / "one"
    single.mkdir()
    (single / "questions.jsonl").write_text(rows("the only question"), encoding="utf-8")
    assert MetaMathQAEnv(dataset_path=single).reset(seed=0)[0] == "the only question"
    assert datasets.split_file(single, "train").name == "questions.jsonl"
    with pytest.raises(FileNotFoundError, match="questions.jsonl"):
        datasets.split_file(single, "test")
