"""SearchQA reads RAGEN v2's default ``train_path`` (``data/search/train.parquet`` under the
working directory) when no path is given and that file exists, so the same seed asks the same
question as RAGEN; without it, the bundled sample."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from turnpool.envs.registry import make
from turnpool.envs.search_qa import RAGEN_TRAIN_PATH


def _question(seed: int) -> str:
    env = make("search", mock_mode=True)
    try:
        obs, _ = env.reset(seed=seed)
    finally:
        env.close()
    return obs.splitlines()[0]


def test_ragens_default_train_path_is_read_from_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    bundled = [_question(seed) for seed in range(5)]
    path = tmp_path / RAGEN_TRAIN_PATH
    path.parent.mkdir(parents=True)
    rows = [{"question": f"own question {i}?", "ground_truth": [f"a{i}"]} for i in range(3)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    # RAGEN v2: row seed % len(data) of its train_path
    assert [_question(seed) for seed in range(5)] == [
        f"Question: own question {seed % 3}?" for seed in range(5)]
    env = make("search", mock_mode=True)
    env.reset(seed=4)
    assert env.step("finish[a1]")[1] == 1.0
    env.close()
    path.unlink()  # absent again: the bundled sample, as before
    assert [_question(seed) for seed in range(5)] == bundled
    assert not any(q.startswith("Question: own question") for q in bundled)


def test_a_given_path_wins_over_ragens_default(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    default = tmp_path / RAGEN_TRAIN_PATH
    default.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([{"question": "default?", "ground_truth": "x"}]), default)
    given = tmp_path / "mine.jsonl"
    given.write_text('{"question": "given?", "ground_truth": "y"}\n', encoding="utf-8")
    env = make("search", mock_mode=True, train_path=str(given))
    assert env.reset(seed=0)[0].startswith("Question: given?")
    env.close()
