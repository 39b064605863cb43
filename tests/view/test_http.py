"""The viewer's JSON over real HTTP on 127.0.0.1 (a `ViewServer` thread, or the
``turnpool view`` command in its own process): filters, episodes, groups, trees, boards and
a record's replay with its first divergence."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from turnpool.rollout.trajectory import read_jsonl
from turnpool.view.server import ViewServer

pytestmark = pytest.mark.timeout(120)


def _get(url: str, path: str) -> httpx.Response:
    return httpx.get(url + path, timeout=30)


@pytest.fixture(scope="module")
def rollout_url(outputs: dict[str, Path]) -> Iterator[str]:
    with ViewServer(outputs["rollout"]) as server:
        yield server.url


def test_summary_names_the_file_and_what_to_filter_by(rollout_url: str,
                                                      outputs: dict[str, Path]) -> None:
    s = _get(rollout_url, "/api/summary").json()
    assert s["kind"] == "rollout" and s["path"] == str(outputs["rollout"])
    assert s["episodes"] == 6 and s["envs"] == {"sokoban": 6}
    assert s["groups"] == ["0-0", "0-1"] and not s["replayable"]


def test_filters_by_env_group_and_success(rollout_url: str,
                                          outputs: dict[str, Path]) -> None:
    trajectories = list(read_jsonl(outputs["rollout"]))

    def ids(query: str) -> list[int]:
        d = _get(rollout_url, "/api/episodes" + query).json()
        assert d["total"] == len(d["episodes"])
        return [e["id"] for e in d["episodes"]]

    assert ids("") == list(range(6))
    assert ids("?success=true") == [i for i, t in enumerate(trajectories) if t.success]
    assert ids("?success=false") == [i for i, t in enumerate(trajectories) if not t.success]
    assert ids("?success=true") and ids("?success=false") and not ids("?success=unknown")
    assert ids("?group=0-1") == [3, 4, 5]
    assert ids("?env=sokoban") == ids("?env=SimpleSokoban") == list(range(6))
    assert ids("?env=bandit") == [] and ids("?group=0-1&success=true") == [
        i for i in (3, 4, 5) if trajectories[i].success]
    page = _get(rollout_url, "/api/episodes?offset=4&limit=1").json()
    assert page["total"] == 6 and [e["id"] for e in page["episodes"]] == [4]


def test_an_episode_turn_by_turn(rollout_url: str, outputs: dict[str, Path]) -> None:
    t = list(read_jsonl(outputs["rollout"]))[1]
    d = _get(rollout_url, "/api/episodes/1").json()
    assert d["boards"] and d["final_obs"] == t.final_state and d["score"] == t.score
    for step, turn in zip(d["steps"], t.turns, strict=True):
        assert (step["obs"], step["reply"], step["actions"], step["executed"], step["valid"],
                step["reward"], step["info"]) == (turn.state, turn.llm_response, turn.actions,
                                                  turn.executed, turn.format_valid,
                                                  turn.reward, turn.info)
    png = _get(rollout_url, "/api/board/1/0.png")
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    assert png.content[:4] == b"\x89PNG"
    assert _get(rollout_url, f"/api/board/1/{len(t.turns) + 1}.png").status_code == 404
    assert _get(rollout_url, "/api/episodes/99").status_code == 404


def test_a_group_side_by_side_with_rewards_and_advantages(rollout_url: str,
                                                          outputs: dict[str, Path]) -> None:
    members = [t for t in read_jsonl(outputs["rollout"]) if t.group_uid == "0-1"]
    g = _get(rollout_url, "/api/groups/0-1").json()
    assert [m["env_id"] for m in g["members"]] == [t.env_id for t in members]
    assert [m["rewards"] for m in g["members"]] == [t.rewards for t in members]
    assert [m["advantage"] for m in g["members"]] == [t.normalized_score for t in members]
    assert g["mean_score"] == pytest.approx(sum(t.score for t in members) / len(members))
    assert _get(rollout_url, "/api/groups/9-9").status_code == 404
    assert _get(rollout_url, "/api/trees/0-1").status_code == 404  # not a tree file


def test_a_tree_with_its_chosen_path(outputs: dict[str, Path]) -> None:
    nodes = [json.loads(line) for line in outputs["tree"].read_text().splitlines()]
    with ViewServer(outputs["tree"], env="sokoban") as server:
        s = _get(server.url, "/api/summary").json()
        assert s["kind"] == "tree" and s["trees"] == ["0-0", "0-1"]
        t = _get(server.url, "/api/trees/0-0").json()
        mine = [n for n in nodes if n["group_uid"] == "0-0"]
        assert [n["node_id"] for n in t["nodes"]] == [n["node_id"] for n in mine]
        assert [n["chosen"] for n in t["nodes"]] == [n["chosen"] for n in mine]
        chosen = [n for n in t["nodes"] if n["chosen"]]
        leaf = _get(server.url, f"/api/episodes/{chosen[-1]['episode']}").json()
        assert leaf["chosen"] and [s["node_id"] for s in leaf["steps"]] == [
            n["node_id"] for n in chosen]
        assert _get(server.url, f"/api/board/{leaf['id']}/0.png").status_code == 200


def test_a_replay_finds_nothing_in_an_untouched_record(outputs: dict[str, Path]) -> None:
    with ViewServer(outputs["record"]) as server:
        assert _get(server.url, "/api/summary").json()["replayable"]
        r = httpx.post(server.url + "/api/replay", timeout=60).json()
    assert r["ok"] and r["first"] is None and r["episodes"] == 6 and r["transitions"] > 6


def test_a_replay_names_the_first_divergence(outputs: dict[str, Path], tmp_path: Path) -> None:
    with gzip.open(outputs["record"], "rt", encoding="utf-8") as fh:
        lines = [json.loads(line) for line in fh]
    target = lines[3]  # the third episode: change what its second step returned
    target["steps"][1]["reward"] = 123.0
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_text("".join(json.dumps(d) + "\n" for d in lines), encoding="utf-8")
    with ViewServer(tampered) as server:
        r = httpx.post(server.url + "/api/replay", timeout=60).json()
        again = httpx.post(server.url + "/api/replay", timeout=60).json()
        shown = _get(server.url, f"/api/episodes/{target['episode']}").json()
    assert not r["ok"] and r["divergent_episodes"] == 1 and again == r
    first = r["first"]
    assert (first["episode"], first["turn"], first["field"], first["recorded"]) == (
        target["episode"], target["steps"][1]["turn"], "reward", 123.0)
    assert first["replayed"] != 123.0 and shown["steps"][1]["reward"] == 123.0


def test_only_a_record_replays(rollout_url: str) -> None:
    assert httpx.post(rollout_url + "/api/replay", timeout=30).status_code == 400


def test_the_page_and_its_files_are_served(rollout_url: str) -> None:
    page = _get(rollout_url, "/")
    assert page.status_code == 200 and "static/view.js" in page.text
    assert "http" not in page.text.replace("http-equiv", "")  # nothing from outside
    assert _get(rollout_url, "/static/view.js").headers["content-type"].startswith(
        "text/javascript")
    assert _get(rollout_url, "/static/../app.py").status_code == 404


def _cli(*args: str, **kw: object) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "turnpool.cli", "view", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, **kw)  # type: ignore[call-overload]


def test_the_command_prints_its_url_and_serves_on_loopback(outputs: dict[str, Path]) -> None:
    proc = _cli(str(outputs["record"]), "--port", "0")
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "6 episodes (record)" in line, line + (proc.stderr.read() if proc.poll() else "")
        url = line.split(" at ")[1].split()[0]
        assert url.startswith("http://127.0.0.1:")
        assert _get(url.rstrip("/"), "/api/summary").json()["kind"] == "record"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_command_refuses_files_it_cannot_read(tmp_path: Path) -> None:
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"x": 1}\n', encoding="utf-8")
    proc = _cli(str(bad))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and err.count("\n") == 1 and "not a rollout" in err


def test_without_the_serve_extra_one_line_names_it(outputs: dict[str, Path]) -> None:
    code = ("import sys; sys.modules['fastapi'] = None; from turnpool.cli import main; "
            f"main(['view', {str(outputs['rollout'])!r}])")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2
    assert res.stderr.strip() == ("Error: turnpool view needs fastapi: "
                                  "pip install 'turnpool[serve]'")


def test_a_missing_file_or_a_busy_port_is_one_line(outputs: dict[str, Path],
                                                   tmp_path: Path) -> None:
    proc = _cli(str(tmp_path / "nothing.jsonl"))
    _, err = proc.communicate(timeout=60)
    missing = tmp_path / "nothing.jsonl"
    assert proc.returncode == 2 and err.strip() == f"Error: {missing}: no such file"
    from turnpool.listen import bind_socket

    busy = bind_socket()
    try:
        proc = _cli(str(outputs["rollout"]), "--port", str(busy.getsockname()[1]))
        _, err = proc.communicate(timeout=60)
    finally:
        busy.close()
    assert proc.returncode == 2 and err.count("\n") == 1
    assert "cannot listen on 127.0.0.1" in err and "--port 0" in err
