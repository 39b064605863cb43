"""What ``turnpool view`` reads: every kind of file turnpool writes, told apart by content,
and boards drawn only where the env offers them."""

from __future__ import annotations

import gzip
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

import turnpool
from turnpool.rollout.record import read_record
from turnpool.rollout.trajectory import read_jsonl
from turnpool.view.boards import board, board_way, png_bytes
from turnpool.view.files import Episode, Step, ViewError, load


def _decode_png(data: bytes) -> np.ndarray:
    """A PNG written by `png_bytes` back to pixels (8-bit RGB, filter 0 only)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, size = 8, b"", (0, 0)
    while pos < len(data):
        (n,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        assert struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0] == zlib.crc32(kind + body)
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h = size
    rows = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(h, 1 + 3 * w)
    assert not rows[:, 0].any()
    return rows[:, 1:].reshape(h, w, 3)


def test_png_bytes_round_trips_pixels() -> None:
    frame = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)
    assert np.array_equal(_decode_png(png_bytes(frame)), frame)
    with pytest.raises(ValueError):
        png_bytes(np.zeros((2, 2, 2), np.uint8))


def test_a_rollout_file_reads_as_its_trajectories(outputs: dict[str, Path]) -> None:
    run = load(outputs["rollout"])
    trajectories = list(read_jsonl(outputs["rollout"]))
    assert run.kind == "rollout" and len(run.episodes) == len(trajectories) == 6
    for e, t in zip(run.episodes, trajectories):
        assert (e.env_type, e.group, e.seed, e.success) == (t.env_type, t.group_uid, t.seed,
                                                            t.success)
        assert [s.obs for s in e.steps] == [turn.state for turn in t.turns]
        assert [s.reply for s in e.steps] == [turn.llm_response for turn in t.turns]
        assert e.advantage == t.normalized_score and e.final_obs == t.final_state
    assert {e.success for e in run.episodes} == {True, False}


def test_parquet_reads_as_the_same_episodes(outputs: dict[str, Path]) -> None:
    jsonl, parquet = load(outputs["rollout"]), load(outputs["parquet"])
    assert parquet.kind == "rollout"
    assert [e.summary() for e in parquet.episodes] == [e.summary() for e in jsonl.episodes]
    assert [s.info for s in parquet.episodes[0].steps] == [s.info for s in
                                                          jsonl.episodes[0].steps]


def test_a_record_reads_whether_gzipped_or_not(outputs: dict[str, Path],
                                              tmp_path: Path) -> None:
    run = load(outputs["record"])
    header, records = read_record(outputs["record"])
    recs = list(records)
    assert run.kind == "record" and run.header is not None
    assert [e.id for e in run.episodes] == [r.episode for r in recs]
    first, rec = run.episodes[0], recs[0]
    assert first.steps[0].obs == rec.reset["obs"] and first.final_obs == rec.steps[-1]["obs"]
    assert [s.reward for s in first.steps] == [s["reward"] for s in rec.steps]
    assert first.success is None and first.steps[0].reply is None  # a record keeps neither
    plain = tmp_path / "plain.jsonl"
    with gzip.open(outputs["record"], "rt", encoding="utf-8") as fh:
        plain.write_text(fh.read(), encoding="utf-8")
    assert [e.summary() for e in load(plain).episodes] == [e.summary() for e in run.episodes]


def test_a_tree_reads_as_one_episode_per_leaf(outputs: dict[str, Path]) -> None:
    run = load(outputs["tree"], env="sokoban")
    nodes = [json.loads(line) for line in outputs["tree"].read_text().splitlines()]
    parents = {n["parent_id"] for n in nodes}
    leaves = [n for n in nodes if n["node_id"] not in parents]
    assert run.kind == "tree" and run.nodes == nodes and len(run.episodes) == len(leaves)
    chosen = [e for e in run.episodes if e.chosen]
    assert len(chosen) == len({n["group_uid"] for n in nodes})  # one chosen path per group
    for e in chosen:  # its every node is on the chosen path, and it starts at the root
        on_path = {n["node_id"] for n in nodes if n["chosen"] and n["group_uid"] == e.group}
        assert [s.node_id for s in e.steps] == sorted(on_path, key=lambda i: int(
            i.split("/")[1]))
        assert [s.turn for s in e.steps] == list(range(len(e.steps)))
    assert load(outputs["tree"]).episodes[0].env_type is None  # the file does not say


def test_other_files_are_refused_with_the_reason(tmp_path: Path) -> None:
    for name, text, why in (("a.jsonl", '{"x": 1}\n', "not a rollout"),
                            ("b.jsonl", "not json\n", "not JSON"),
                            ("c.jsonl", "", "empty"),
                            ("d.jsonl", "[1, 2]\n", "not a JSON object")):
        (tmp_path / name).write_text(text, encoding="utf-8")
        with pytest.raises(ViewError, match=why):
            load(tmp_path / name)


def test_sokoban_boards_are_drawn_from_the_text(outputs: dict[str, Path]) -> None:
    e = load(outputs["rollout"]).episodes[0]
    assert board_way(e) == "hook"
    for k, obs in enumerate(e.observations()):
        pixels = _decode_png(board(e, k) or b"")
        rows = obs.split("\n")
        assert pixels.shape == (16 * len(rows), 16 * len(rows[0]), 3)
    assert board(e, len(e.steps) + 1) is None
    broken = Episode(0, "sokoban", "t", "g", 0, 1, [], "not a grid", None, 0.0)
    assert board(broken, 0) is None  # a text the hook refuses: no board, no error


def _walk(env_type: str, seed: int, moves: list[str]) -> Episode:
    """An episode of ``env_type`` played here, as a file would hold it."""
    env = turnpool.make(env_type)
    obs, _ = env.reset(seed=seed)
    steps = []
    for k, move in enumerate(moves):
        nxt, reward, term, trunc, info = env.step(move)
        steps.append(Step(k, obs, None, [move], [move], True, reward, term or trunc, info))
        obs = nxt
    return Episode(0, env_type, "t", "g", 0, seed, steps, obs, None, 0.0)


@pytest.mark.parametrize("observation_format", ["grid", "coord"])
def test_frozen_lake_is_drawn_from_its_grid_or_by_replay(observation_format: str) -> None:
    kwargs = {"observation_format": observation_format}
    env = turnpool.make("frozen_lake", **kwargs)
    obs, _ = env.reset(seed=4)
    steps, frames = [], [env.render("rgb_array")]
    for k, move in enumerate(["Down", "Right"]):
        nxt, reward, term, trunc, info = env.step(move)
        steps.append(Step(k, obs, None, [move], [move], True, reward, term or trunc, info))
        frames.append(env.render("rgb_array"))
        obs = nxt
    e = Episode(0, "frozen_lake", "t", "g", 0, 4, steps, obs, None, 0.0, env_kwargs=kwargs)
    assert board_way(e) == "hook"
    for k, frame in enumerate(frames):  # a coord text the hook cannot read: replayed
        np.testing.assert_array_equal(_decode_png(board(e, k) or b""), frame)


@pytest.fixture
def line_env(monkeypatch: pytest.MonkeyPatch) -> str:
    """``view_line`` registered for this test only."""
    from turnpool.envs import registry

    monkeypatch.setitem(registry._REGISTRY, "view_line",
                        registry.EnvSpec("view_line", "tests.view.line_env:LineEnv"))
    return "view_line"


def test_an_rgb_array_env_is_drawn_by_a_checked_replay(line_env: str) -> None:
    e = _walk(line_env, 5, ["Left", "Right", "Right"])
    assert board_way(e) == "replay"
    for k, obs in enumerate(e.observations()):
        red = _decode_png(board(e, k) or b"")[0, :, 0]
        assert red.tolist() == [255 if ch == "P" else 0 for ch in obs]
    e.steps[1].obs = "P____" if e.steps[1].obs != "P____" else "_P___"  # not what it saw
    assert board(e, 0) is not None and board(e, 2) is None
    e.seed = None
    assert board_way(e) is None


def test_envs_without_frames_or_by_entry_point_get_no_board(line_env: str) -> None:
    assert board_way(Episode(0, "bandit", "t", "g", 0, 1, [], "x", None, 0.0)) is None
    e = _walk(line_env, 5, ["Left"])
    e.env_type = "tests.view.line_env:LineEnv"  # a file that names code: never imported
    assert board_way(e) is None and board(e, 0) is None


def test_a_trajectory_files_tags_get_the_kwargs_the_rollout_used(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from turnpool.cli import main
    from turnpool.cli.errors import UserError
    from turnpool.cli.view import tag_kwargs

    record = tmp_path / "fl.jsonl"
    res = CliRunner().invoke(main, [
        "rollout", "--no-progress", "--backend", "sequential", "--policy", "random",
        "es_manager.train.env_groups=1", "es_manager.train.env_configs.n_groups=[1]",
        "es_manager.train.group_size=1", "es_manager.train.env_configs.tags=[FrozenLake]",
        "--record", str(record)])
    assert res.exit_code == 0, res.output
    header, records = read_record(record)
    records.close()
    kwargs = tag_kwargs(None, {"FrozenLake", "NoSuchTag", "a]b"})
    assert kwargs == {"FrozenLake": header.specs[0].env_kwargs}
    with pytest.raises(UserError, match="--config"):
        tag_kwargs(str(tmp_path / "missing.yaml"), {"FrozenLake"})


def test_groups_of_a_multi_batch_run_stay_apart(tmp_path: Path) -> None:
    from tests.view.conftest import _rollout

    out, tree = tmp_path / "t.jsonl", tmp_path / "tree.jsonl"
    _rollout("--batches", "2", "--out", str(out))
    _rollout("--batches", "2", "turnpool.collector.tree.mode=best_of_n", "--tree-out",
             str(tree))
    trajectories = list(read_jsonl(out))
    assert len({t.group_uid for t in trajectories}) == 4  # each batch numbers its own
    run = load(out)
    groups: dict[str, set[int | None]] = {}
    for e in run.episodes:
        groups.setdefault(e.group, set()).add(e.seed)
    assert len(groups) == 4 and all(len(seeds) == 1 for seeds in groups.values())
    assert all(len([e for e in run.episodes if e.group == g]) == 3 for g in groups)
    trees = load(tree, env="sokoban")
    assert len({n["node_id"] for n in trees.nodes}) == len(trees.nodes)
    assert len({e.group for e in trees.episodes}) == 4
    assert sum(1 for e in trees.episodes if e.chosen) == 4  # one chosen path per tree
    assert all(e.steps[0].turn == 0 for e in trees.episodes)  # every path starts at a root
