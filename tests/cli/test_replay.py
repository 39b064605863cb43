"""``turnpool rollout --record`` and ``turnpool replay`` through click's CliRunner: a recorded
async run of 10,000 episodes replays with no divergence, a planted divergence is named (exit 1),
lock-step and async runs record the same transitions, a record replays on another backend, and
a file that is not a record is one ``Error:`` line with exit code 2."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from turnpool.cli import main
from turnpool.rollout.trajectory import read_jsonl

pytestmark = pytest.mark.timeout(180)

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
#: 1,250 groups of 8 one-pull bandits: 10,000 episodes in about two seconds
BANDIT_10K = ["--config", str(CONFIGS / "bandit.yaml"), "--policy", "random",
              "es_manager.train.env_groups=1250", "es_manager.train.env_configs.n_groups=[1250]",
              "es_manager.train.group_size=8", "turnpool.backend=sequential"]
#: FrozenLake, several turns, RAGEN v1 multi-action turns (3 actions a reply)
LAKE = ["--config", str(CONFIGS / "frozen_lake.yaml"), "--policy", "random",
        "es_manager.train.env_groups=6", "es_manager.train.env_configs.n_groups=[6]",
        "es_manager.train.group_size=4", "agent_proxy.max_turn=5",
        "agent_proxy.max_actions_per_turn=3", "turnpool.ragen_version=v1",
        "turnpool.backend=sequential"]


def _run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _lines(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _write(path: Path, lines: list[dict[str, Any]]) -> None:
    text = "".join(json.dumps(d, sort_keys=True) + "\n" for d in lines)
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(text)
    else:
        path.write_text(text, encoding="utf-8")


def _replay(record: Path, *extra: str, json_out: Path | None = None
            ) -> tuple[Result, dict[str, Any]]:
    args = ["replay", str(record), *extra]
    if json_out is not None:
        args += ["--json", str(json_out)]
    res = _run(*args)
    return res, (json.loads(json_out.read_text()) if json_out and json_out.exists() else {})


def _errors(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("Error:")]


def test_an_async_run_of_10000_episodes_replays_with_no_divergence_and_a_plant_is_named(
        tmp_path: Path) -> None:
    record, summary = tmp_path / "run.jsonl.gz", tmp_path / "summary.json"
    res = _run("rollout", "--no-progress", *BANDIT_10K, "turnpool.collector.mode=async",
               "--record", str(record), "--json", str(summary))
    assert res.exit_code == 0, res.output
    assert f"recorded 10000 episode attempts to {record}" in " ".join(res.output.split())
    lines = _lines(record)
    assert lines[0]["format"] == "turnpool-record" and lines[0]["collector_mode"] == "async"
    assert [d["episode"] for d in lines[1:]] == list(range(10_000))
    # every pool call is in the record: one step per executed (one-action) turn
    env_steps = json.loads(summary.read_text())["metrics"]["env_steps"]
    assert sum(len(d["steps"]) for d in lines[1:]) == env_steps > 5000

    res, report = _replay(record, json_out=tmp_path / "replay.json")
    assert res.exit_code == 0, res.output
    assert report["episodes"] == 10_000 and report["divergent_episodes"] == 0
    assert report["transitions"] == 10_000 + env_steps and report["not_compared"] == 0
    assert report["first_divergence"] is None and report["collector_mode"] == "async"
    assert "transitions/s" in res.output and "divergent episodes" in res.output

    # a planted divergence: one step's reward, deep in the file
    k = next(k for k in range(7000, 10_001) if lines[k]["steps"])
    lines[k]["steps"][0]["reward"] += 1.0
    planted = tmp_path / "planted.jsonl.gz"
    _write(planted, lines)
    res, report = _replay(planted, json_out=tmp_path / "planted.json")
    assert res.exit_code == 1, res.output
    errors = _errors(res.output)
    assert len(errors) == 1 and "Traceback" not in res.output
    episode = lines[k]["episode"]
    assert (f"first divergence: episode {episode} (line {k + 1}; env {lines[k]['env_id']}, "
            f"bandit, tag Bandit, seed {lines[k]['seed']}), turn 0: reward") in errors[0]
    assert report["divergent_episodes"] == 1 and report["episodes"] == 10_000


def test_a_divergence_in_a_later_turn_is_the_first_in_the_file(tmp_path: Path) -> None:
    record = tmp_path / "lake.jsonl"
    res = _run("rollout", "--no-progress", *LAKE, "--record", str(record))
    assert res.exit_code == 0, res.output
    lines = _lines(record)
    res, _ = _replay(record)
    assert res.exit_code == 0, res.output
    # two plants: a later episode's reset and an earlier episode's third step (its obs)
    first = next(k for k in range(1, len(lines)) if len(lines[k]["steps"]) >= 3)
    later = len(lines) - 1
    assert later > first
    lines[later]["reset"]["obs"] += " "
    lines[first]["steps"][2]["obs"] = lines[first]["steps"][2]["obs"].replace("P", "_")
    turn = lines[first]["steps"][2]["turn"]
    _write(record, lines)
    res, report = _replay(record, json_out=tmp_path / "r.json")
    assert res.exit_code == 1, res.output
    errors = _errors(res.output)
    assert len(errors) == 1
    assert f"episode {lines[first]['episode']} " in errors[0]
    assert f"turn {turn}: obs recorded" in errors[0] and "(1 more episode(s) diverged)" in errors[0]
    assert report["divergent_episodes"] == 2


@pytest.mark.parametrize("ragen", ["v1", "v2"])
def test_lockstep_and_async_record_the_same_transitions_as_the_trajectories(
        tmp_path: Path, ragen: str) -> None:
    """The record is what the pool returned: each step's actions and results match the
    trajectory's turn (executed actions, reward, the next turn's state), and the async
    collector records each env's transitions as lock-step does. v1 runs a multi-action turn
    as one pool call, v2 as one call per action, merged: either is one step."""
    by_mode = {}
    for mode in ("lockstep", "async"):
        record, out = tmp_path / f"{mode}.jsonl", tmp_path / f"{mode}.out.jsonl"
        res = _run("rollout", "--no-progress", *LAKE, f"turnpool.ragen_version={ragen}",
                   f"turnpool.collector.mode={mode}", "--record", str(record), "--out", str(out))
        assert res.exit_code == 0, res.output
        by_mode[mode] = _lines(record)
        res, _ = _replay(record)
        assert res.exit_code == 0, res.output
    lock, asy = by_mode["lockstep"], by_mode["async"]
    assert lock[1:] == asy[1:]
    assert {k: v for k, v in lock[0].items() if k != "collector_mode"} == \
        {k: v for k, v in asy[0].items() if k != "collector_mode"}
    assert lock[0]["ragen_version"] == ragen
    trajectories = {t.env_id: t for t in read_jsonl(tmp_path / "async.out.jsonl")}
    assert len(trajectories) == len(lock) - 1 == 24
    multi = 0
    for line in lock[1:]:
        t = trajectories[line["env_id"]]
        assert line["seed"] == t.seed and line["tag"] == t.tag == "FrozenLake"
        assert line["reset"]["obs"] == (t.turns[0].state if t.turns else t.final_state)
        stepped = [k for k, turn in enumerate(t.turns) if turn.executed]
        assert [s["turn"] for s in line["steps"]] == stepped
        for s in line["steps"]:
            k = s["turn"]
            assert s["actions"][: s["n_executed"]] == t.turns[k].executed
            assert s["reward"] == t.turns[k].reward
            after = t.turns[k + 1].state if k + 1 < len(t.turns) else t.final_state
            assert s["obs"] == after
            multi += len(s["actions"]) > 1
    assert multi > 0  # multi-action turns were recorded as one pool call each


def test_a_record_replays_on_another_backend_over_several_batches(tmp_path: Path) -> None:
    """An async run on process workers (each env's steps in a timing-dependent order)
    records what a lock-step sequential run records, and each replays on the other."""
    record = tmp_path / "proc.jsonl.gz"
    res = _run("rollout", "--no-progress", *LAKE, "--backend", "process", "--workers", "2",
               "turnpool.collector.mode=async", "--batches", "2", "--record", str(record))
    assert res.exit_code == 0, res.output
    lines = _lines(record)
    assert {d["batch"] for d in lines[1:]} == {0, 1} and len(lines) == 1 + 48
    assert len({d["seed"] for d in lines[1:]}) == 12  # two batches, six groups each
    res, report = _replay(record, "--backend", "sequential", json_out=tmp_path / "a.json")
    assert res.exit_code == 0, res.output
    assert report["episodes"] == 48 and report["backend"] == "sequential"
    seq = tmp_path / "seq.jsonl"
    res = _run("rollout", "--no-progress", *LAKE, "--batches", "2", "--record", str(seq))
    assert res.exit_code == 0, res.output
    assert _lines(seq)[1:] == lines[1:]  # the same run on either backend records the same
    res, report = _replay(seq, "--backend", "process", "--workers", "2",
                          json_out=tmp_path / "b.json")
    assert res.exit_code == 0, res.output
    assert report["backend"] == "process" and report["num_workers"] == 2
    assert report["divergent_episodes"] == 0 and report["transitions"] > 48


def test_dynamic_sampling_records_every_generation_batch(tmp_path: Path) -> None:
    """Groups that dynamic sampling drops were played too: their envs' transitions are in
    the record, one ``batch`` per generation batch."""
    record, summary = tmp_path / "dyn.jsonl", tmp_path / "s.json"
    res = _run("rollout", "--no-progress", *LAKE, "algorithm.filter_groups.enable=true",
               "algorithm.filter_groups.max_num_gen_batches=30",
               "turnpool.collector.target_groups=6", "--record", str(record),
               "--json", str(summary))
    assert res.exit_code == 0, res.output
    batches = int(json.loads(summary.read_text())["metrics"]["dynamic/gen_batches"])
    lines = _lines(record)
    assert batches >= 2 and len(lines) == 1 + 24 * batches
    assert [d["batch"] for d in lines[1:]] == [b for b in range(batches) for _ in range(24)]
    res, report = _replay(record, json_out=tmp_path / "r.json")
    assert res.exit_code == 0, res.output
    assert report["episodes"] == 24 * batches and report["divergent_episodes"] == 0


def test_a_file_that_is_not_a_record_is_one_error_line_and_exit_2(tmp_path: Path) -> None:
    record = tmp_path / "lake.jsonl"
    out = tmp_path / "trajectories.jsonl"
    res = _run("rollout", "--no-progress", *LAKE, "--record", str(record), "--out", str(out))
    assert res.exit_code == 0, res.output
    lines = _lines(record)
    cases: dict[str, tuple[bytes, str]] = {}

    def case(name: str, data: bytes, says: str) -> None:
        cases[name] = (data, says)

    def text(ls: list[dict[str, Any]]) -> bytes:
        return "".join(json.dumps(d) + "\n" for d in ls).encode()

    case("empty.jsonl", b"", "empty file")
    case("trajectories.jsonl", out.read_bytes(), "not a turnpool record")
    case("binary.jsonl", bytes(range(256)) * 4, "not a turnpool record")
    case("truncated.jsonl.gz", gzip.compress(record.read_bytes())[:200], "not a turnpool record")
    case("newer.jsonl", text([{**lines[0], "version": 99}, *lines[1:]]), "record version 99")
    case("no-specs.jsonl", text([{k: v for k, v in lines[0].items() if k != "specs"}]),
         "no field 'specs'")
    case("no-steps.jsonl", text([lines[0], {k: v for k, v in lines[1].items() if k != "steps"}]),
         "line 2: a damaged episode line (no field 'steps')")
    case("bad-json.jsonl", text(lines[:3])[:-20] + b"\n" + text(lines[3:4]), "line 3: not JSON")
    case("far-env.jsonl", text([lines[0], {**lines[1], "env_id": 10_000}]),
         "env 10000 is not in the recorded pool (24 envs)")
    case("wrong-tag.jsonl", text([lines[0], {**lines[1], "tag": "Other"}]),
         "in the record's header")
    spec = {**lines[0]["specs"][0], "env_type": "frozen_lak"}
    case("unknown-env.jsonl", text([{**lines[0], "specs": [spec]}, *lines[1:]]),
         "unknown env 'frozen_lak' (did you mean 'frozen_lake'?)")
    for name, (data, says) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        res = _run("replay", str(path))
        assert res.exit_code == 2, (name, res.output)
        errors = _errors(res.output)
        assert len(errors) == 1 and "Traceback" not in res.output, (name, res.output)
        assert says in " ".join(res.output.split()), (name, res.output)
    res = _run("replay", str(tmp_path / "missing.jsonl"))
    assert res.exit_code == 2 and "no such file" in res.output
    res = _run("rollout", "--no-progress", *LAKE, "--record", str(tmp_path / "no" / "r.jsonl"))
    assert res.exit_code == 2 and "--record" in res.output and "Traceback" not in res.output


def test_a_tree_rollout_is_refused_by_record_before_any_env_runs(tmp_path: Path) -> None:
    record = tmp_path / "tree.jsonl"
    res = _run("rollout", "--no-progress", *LAKE, "turnpool.collector.tree.mode=best_of_n",
               "--record", str(record))
    assert res.exit_code == 2, res.output
    assert "tree rollout cannot be recorded" in " ".join(res.output.split())
    assert not record.exists()
