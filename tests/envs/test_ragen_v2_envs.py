"""RAGEN v2's envs as turnpool runs them: the rules RAGEN leaves open (invalid text), the
RAGEN adapter's v2 fixes (gymnasium-style resets, adapter-only env types, envs that seed the
process-global RNG kept off threads). Seed-by-seed agreement with RAGEN's own classes is in
``tests/ragen/test_golden_envs.py``."""

from __future__ import annotations

import http.server
import json
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from turnpool import EnvPool
from turnpool.envs import ragen_adapter
from turnpool.envs.base import TextEnv
from turnpool.envs.registry import draws_from_global_rng, make, resolve
from turnpool.extras import MissingExtra
from turnpool.ragen.config import ragen_defaults
from turnpool.worker.errors import BackendUnavailable

GYMNASIUM_STYLE = '''
class TileEnv:
    """Resets like RAGEN v2's 2048: a gymnasium (obs, info) pair."""

    def reset(self, seed=None, mode=None):
        return f"tiles {seed}", {"grid": [seed]}

    def step(self, action):
        return "moved", 0.5, False, {"success": False}
'''

GLOBAL_SEEDING = '''
import random


class DiceEnv:
    """Seeds the process-global RNG per reset, as RAGEN's Sudoku does."""

    def reset(self, seed=None, mode=None):
        random.seed(seed)
        return f"dice {random.randint(1, 6)}"

    def step(self, action):
        roll = random.randint(1, 6)
        return f"rolled {roll}", float(roll), False, {"success": roll == 6}
'''


@pytest.fixture
def pkgs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for folder, name, source in (("a", "tile_env", GYMNASIUM_STYLE),
                                 ("b", "dice_env", GLOBAL_SEEDING)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / f"{name}.py").write_text(source, encoding="utf-8")
        monkeypatch.syspath_prepend(str(tmp_path / folder))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "b"))
    for name in ("tile_env", "dice_env"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return tmp_path


def test_a_gymnasium_style_reset_pair_reads_as_its_observation(pkgs: Path) -> None:
    env = make("tile_env:TileEnv")
    obs, info = env.reset(seed=7)
    assert obs == "tiles 7" and "grid" not in info


def test_envs_that_seed_the_global_rng_are_found_by_the_probe(pkgs: Path) -> None:
    assert draws_from_global_rng("dice_env:DiceEnv", {}) == "dice_env:DiceEnv"
    assert draws_from_global_rng("tile_env:TileEnv", {}) is None
    assert draws_from_global_rng("sudoku", {}) is None  # native: its own random.Random

    class GlobalDraws(TextEnv):
        uses_global_rng = True

    GlobalDraws.__module__ = __name__
    globals()["GlobalDraws"] = GlobalDraws
    assert draws_from_global_rng(f"{__name__}:GlobalDraws", {}) == "GlobalDraws"


def _rolls(backend: str, num_workers: int, fallback: bool = False) -> tuple[str, list[str]]:
    with EnvPool("dice_env:DiceEnv", env_num=8, seed=11, backend=backend,
                 num_workers=num_workers, fallback=fallback) as pool:
        out, _ = pool.reset()
        for _ in range(3):
            obs, *_ = pool.step(["roll"] * 8)
            out += obs
        return pool.backend_name, out


def test_threads_refuse_global_rng_envs_and_a_fallback_pool_runs_them_in_turn(
        pkgs: Path) -> None:
    with pytest.raises(BackendUnavailable, match="dice_env:DiceEnv draw from the process-global"):
        _rolls("thread", 2)  # a backend the user names is never replaced
    name, texts = _rolls("thread", 2, fallback=True)
    assert name == "sequential"
    assert texts == _rolls("sequential", 1)[1]


@pytest.mark.parametrize("env_type, needs", [("lean", "kimina_client"),
                                             ("alfworld", "alfworld"),
                                             ("spatial", "submodule"),
                                             ("static", "datasets")])
def test_adapter_only_env_types_name_what_is_missing(env_type: str, needs: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ragen", "ragen.env"):  # RAGEN's code is not importable
        monkeypatch.setitem(sys.modules, name, None)
    assert ragen_adapter.ragen_registry() is None
    with pytest.raises(MissingExtra) as caught:
        make(env_type)
    text = str(caught.value)
    assert "\n" not in text and needs in text and "RAGEN" in text and env_type in text


# ----------------------------------------------------------------- where RAGEN is silent
def test_sudoku_reads_every_action_format_and_bounds_hostile_text() -> None:
    env = make("sudoku", grid_size=4, difficulty="hard")
    env.reset(seed=3)
    r, c = next((r, c) for r in range(4) for c in range(4) if not env.initial[r][c])
    right = env.solution[r][c]
    *_, info = env.step(f"I place {right} at row {r + 1} col {c + 1}")
    assert info["action_is_valid"] and info["correct_placement"]
    *_, info = env.step(f"({r + 1},{c + 1},{right})")  # same number again: it clashes
    assert not info["action_is_valid"] and "conflicts" in info["error"]
    obs, reward, terminated, truncated, info = env.step("1," * 100_000)
    assert reward == -0.1 and not info["action_is_valid"] and len(obs) < 10_000
    assert not (terminated or truncated)


def test_game_2048_and_rubikscube_treat_unknown_actions_as_no_ops() -> None:
    for env_type in ("game_2048", "rubikscube"):
        env = make(env_type)
        obs, _ = env.reset(seed=5)
        after, reward, terminated, truncated, info = env.step("sideways")
        assert (after, reward, terminated, truncated) == (obs, 0.0, False, False)
        assert not info["action_is_valid"]


def test_game_2048_invalid_moves_pay_the_penalty_raw_and_nothing_logged() -> None:
    env = make("game_2048")
    env.reset(seed=0)
    for _ in range(50):
        blocked = [a for a in range(4) if a not in env.valid_actions()]
        if blocked:
            break
        env.step(env.valid_actions()[0])
    assert blocked
    _, reward, _, _, info = env.step(blocked[0])
    assert reward == 0.0 and info["raw_reward"] == -0.1 and not info["action_is_valid"]


def test_rubikscube_inverse_turns_undo_each_other() -> None:
    env = make("rubikscube", scramble_depth=0)
    start, _ = env.reset(seed=0)
    for a in range(1, 13, 2):
        env.step(a)
        obs, reward, terminated, *_ = env.step(a + 1)
        assert reward == 1.0 and terminated and "Cube Solved!" in obs
    assert start.startswith("=== Rubik's Cube 2x2 State ===")


# ------------------------------------------------------------------------------ WebShop
def test_webshop_seed_to_goal_fails_exactly_where_ragen_does() -> None:
    from turnpool.webshop.data import goal_for_seed

    assert sorted(goal_for_seed(s, "test", 500) for s in range(500)) == list(range(500))
    assert goal_for_seed(129, "test", 600) < 600
    with pytest.raises(ValueError, match="past the 499 goals"):
        goal_for_seed(499, "test", 499)
    assert goal_for_seed(498, "test", 499) < 499
    assert goal_for_seed(2_099, "val", 1_100) < 1_100  # 99 + 500 < 1,100
    with pytest.raises(ValueError, match="goal 1100"):
        goal_for_seed(600, "val", 1_100)
    with pytest.raises(ValueError, match="more than 1500"):
        goal_for_seed(0, "train", 1_500)
    assert goal_for_seed(7, "train", 1_501) == goal_for_seed(8, "train", 1_501)


def test_webshop_v2_binarizes_the_reward_and_keeps_the_raw_one() -> None:
    plain = make("webshop", split="test", binarize_reward=False)
    binary = make("webshop", split="test")  # v2's default, as its config class's
    for seed in range(40):
        rewards = []
        for env in (plain, binary):
            env.reset(seed=seed)
            env.step("search[shirt]")
            listed = env.shop.actions(env.state)
            item = next((a for a in listed if a.startswith("click[b0")), None)
            if item is None:
                break
            env.step(item)
            rewards.append(env.step("click[buy now]")[1:])
        if len(rewards) < 2:
            continue
        (raw, *_), (reward, _, _, info) = rewards
        assert info["raw_reward"] == raw and reward == (1.0 if raw >= 1.0 else 0.0)
        if 0 < raw < 1:
            return
    pytest.fail("no partial-credit purchase in 40 seeds")


def test_webshop_v2_hint_lines_and_validity_rule() -> None:
    from turnpool.envs.webshop_ragen import RagenWebShopEnv

    v1 = make("webshop", split="test", **ragen_defaults(RagenWebShopEnv, "v1"))
    v2 = make("webshop", split="test")  # the class's own defaults are v2's
    obs1, obs2 = v1.reset(seed=3)[0], v2.reset(seed=3)[0]
    # v1 runs two hint lines together (a missing comma in its list); v2 has them apart
    assert "2 times.Almost never click[< prev]" in obs1
    assert "2 times.\nAlmost never click[< prev]" in obs2
    assert obs1.replace("2 times.Almost", "2 times.\nAlmost") == obs2
    # v2 parses the action: an empty search is not valid, a click is matched lowercased
    # (it also runs in v1, which only checks the listed text)
    assert [v.step("search[]")[4]["action_is_valid"] for v in (v1, v2)] == [True, False]
    for env in (v1, v2):
        env.step("search[shirt]")
    listed = v1.shop.actions(v1.state)
    item = next(a for a in listed if a.startswith("click[b0"))
    upper = "click[" + item[6:-1].upper() + "]"
    assert [v.step(upper)[4]["action_is_valid"] for v in (v1, v2)] == [False, True]
    assert v1.render().replace("2 times.Almost", "2 times.\nAlmost") == v2.render()
    # ... and text after the closing bracket does not matter to v2
    assert v2.step("click[< prev]!")[4]["action_is_valid"]
    assert not v2.step("click[search]")[4]["action_is_valid"]
    assert not v2.step("x" * 5000)[4]["action_is_valid"]


# ------------------------------------------------------------------------------ SearchQA
class _Retrieval(http.server.BaseHTTPRequestHandler):
    """A retrieval server: echoes the query into its documents; "boom" answers 500."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body["query"] == "boom":
            status, reply = 500, {"error": "index not loaded"}
        else:
            status, reply = 200, {"results": [
                {"id": f"d{i}", "content": f"{body['query']} " + "x" * 900 * (i == 0),
                 "score": 1 / (i + 1)} for i in range(body["top_k"] + 3)]}
        data = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def retrieval_url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Retrieval)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_search_qa_asks_the_retrieval_server_and_formats_its_documents(
        retrieval_url: str) -> None:
    env = make("search", retrieval_server_url=retrieval_url, max_search_results=2,
               retrieval_timeout=10)
    env.reset(seed=4)
    obs, reward, terminated, _, info = env.step("search[tallest peak]")
    first = "tallest peak " + "x" * (800 - len("tallest peak ")) + "..."  # cut at 800
    assert obs == ("Search results for 'tallest peak':\n[Document 1] (ID: d0, Score: 1.000)\n"
                   f"{first}\n\n[Document 2] (ID: d1, Score: 0.500)\ntallest peak \n\n"
                   "Available actions: search[<query>], finish[<answer>]")
    assert (reward, terminated, info["action_type"]) == (0.0, False, "search")
    obs, *_ = env.step("search[boom]")
    assert "Retrieval server error (status 500): index not loaded" in obs
    short = make("search", retrieval_server_url=retrieval_url, max_total_chars=300)
    short.reset(seed=0)
    results = short.step("search[q]")[0].split(":\n", 1)[1].rsplit("\n\n", 1)[0]
    assert len(results) == 303 and results.endswith("...")


def test_search_qa_names_an_unreachable_server_and_scores_answers() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens there once closed
    env = make("search", retrieval_server_url=f"http://127.0.0.1:{port}", max_steps=2)
    obs, _ = env.reset(seed=1)
    assert obs.startswith("Question: What is the capital city of Australia?")
    obs, _, done, _, _ = env.step("search[capital]")
    assert "Could not connect to retrieval server" in obs and not done
    obs, reward, done, _, info = env.step("The answer is **Canberra**, clearly.")
    assert reward == 1.0 and done and not info["action_is_valid"] and info["success"]
    assert info["extracted_answer"] == "Canberra"


#: RAGEN v2's ``config/envs.yaml``: env_type and env_config of each tag turnpool runs natively
V2_TAGS: dict[str, tuple[str, dict[str, Any]]] = {
    "SimpleSokoban": ("sokoban", {"dim_x": 6, "dim_y": 6, "num_boxes": 1, "max_steps": 100}),
    "CoordSokoban": ("sokoban", {"dim_x": 6, "dim_y": 6, "num_boxes": 1, "max_steps": 100,
                                 "observation_format": "grid_coord"}),
    "VisualSimpleSokoban": ("sokoban", {"dim_x": 6, "dim_y": 6, "num_boxes": 1,
                                        "max_steps": 100, "render_mode": "rgb_array"}),
    "Countdown": ("countdown", {}),
    "Bandit": ("bandit", {"split": "train"}),
    "BanditTest": ("bandit", {"split": "test"}),
    "FrozenLake": ("frozen_lake", {"success_rate": 0.8}),
    "CoordFrozenLake": ("frozen_lake", {"observation_format": "grid_coord",
                                        "success_rate": 0.8}),
    "MetamathQA": ("metamathqa", {}),
    "WebShop": ("webshop", {"dataset": "small"}),
    "SimpleSudoku": ("sudoku", {"grid_size": 9, "difficulty": "easy",
                                "render_format": "with_feedback", "show_conflicts": True,
                                "show_valid_numbers": True, "max_steps": 81}),
    "SearchQA": ("search", {"max_steps": 10, "max_search_results": 5}),
    "SearchQAMock": ("search", {"max_steps": 10, "max_search_results": 5, "mock_mode": True}),
    "game_2048": ("game_2048", {}),
    "rubikscube": ("rubikscube", {"scramble_depth": 1, "max_steps": 20, "render_mode": "text"}),
}


@pytest.mark.parametrize("tag", sorted(V2_TAGS))
def test_every_native_ragen_v2_tag_builds_without_a_warning(tag: str) -> None:
    import warnings

    env_type, env_config = V2_TAGS[tag]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env = make(env_type, **{**ragen_defaults(resolve(env_type)[0], "v2"), **env_config})
        obs, _ = env.reset(seed=1)
    assert isinstance(obs, str) and obs
