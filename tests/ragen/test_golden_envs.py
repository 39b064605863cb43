"""turnpool's envs against RAGEN's own env code, seed by seed (golden traces, 200 seeds per
env config of RAGEN's ``config/envs.yaml``), plus the live references that are installed here:
gym_sokoban's generator stages and tiles, gymnasium's FrozenLake, CPython's ``hash``."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.ragen.golden import FIXTURES, load, tagged, untag
from turnpool.envs import sokoban_gen
from turnpool.envs.registry import make, resolve
from turnpool.envs.sokoban import SokobanEnv
from turnpool.ragen.config import ragen_defaults

pytestmark = pytest.mark.timeout(300)

#: fixture -> turnpool env type
ENVS = {"SimpleSokoban": "sokoban", "LargerSokoban": "sokoban",
        "SokobanDifferentGridVocab": "sokoban", "VisualSimpleSokoban": "sokoban",
        "FrozenLake": "frozen_lake", "FrozenLakeNotSlippery": "frozen_lake",
        "Bandit": "bandit", "BanditTest": "bandit", "MetamathQA": "metamathqa",
        "Countdown": "countdown"}
RAGEN_INFO_KEYS = ("action_is_effective", "action_is_valid", "success")


def _env_for(name: str, tmp_path: Path) -> Any:
    fx = load(name)
    kwargs = untag(fx["env_config"])
    if name == "Countdown":
        # RAGEN read a parquet of the bundled puzzles; the same rows as JSONL here
        bundled = Path(__file__).resolve().parents[2] / "turnpool" / "data" / "countdown.jsonl"
        data = tmp_path / "countdown.jsonl"
        data.write_text(bundled.read_text(encoding="utf-8"), encoding="utf-8")
        kwargs["train_path"] = str(data)
    cls, _ = resolve(ENVS[name])  # RAGEN v1's defaults where the class's own are v2's
    return make(ENVS[name], **{**ragen_defaults(cls, "v1"), **kwargs})


@pytest.mark.parametrize("name", sorted(ENVS))
def test_env_matches_ragen_seed_by_seed(name: str, tmp_path: Path) -> None:
    fx = load(name)
    env = _env_for(name, tmp_path)
    visual = name.startswith("Visual")
    assert len(fx["episodes"]) >= 200
    for ep in fx["episodes"]:
        obs, _ = env.reset(seed=ep["seed"])
        if visual:
            assert tagged(env.render("rgb_array")) == ep["obs"], ep["seed"]
            assert obs == ep["text"]
        else:
            assert obs == ep["obs"], ep["seed"]
        if "correct_answer" in ep:
            assert env.correct_answer == ep["correct_answer"]
        for action, want in zip(ep["actions"], ep["steps"]):
            obs, reward, terminated, truncated, info = env.step(action)
            where = (ep["seed"], action)
            if visual:
                assert tagged(env.render("rgb_array")) == want["obs"], where
                assert obs == want["text"], where
            else:
                assert obs == want["obs"], where
            assert reward == untag(want["reward"]), where
            assert (terminated or truncated) == want["done"], where
            ragen_info = untag(want["info"])
            assert {k: info[k] for k in ragen_info} == ragen_info, where


# ----------------------------------------------------------------------- RAGEN v2
V2_FIXTURES = FIXTURES.parent / "ragen_v2" / "envs"
#: RAGEN v2 fixtures that store every text (the others store sha256 digests per step)
V2_PLAIN = ("SimpleSokoban", "CoordSokoban", "CoordOnlySokoban", "FrozenLake",
            "CoordFrozenLake", "FrozenLakeCoordNotSlippery", "Bandit", "BanditTest",
            "SearchQAMock")


def load_v2(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((V2_FIXTURES / f"{name}.json").read_text("utf-8"))
    return data


def make_v2(env_type: str, env_config: dict[str, Any]) -> Any:
    """An env as a RAGEN v2 config builds it: v2's defaults (where the class's own differ)
    under the tag's env_config."""
    cls, _ = resolve(env_type)
    return make(env_type, **{**ragen_defaults(cls, "v2"), **env_config})


@pytest.mark.parametrize("name", V2_PLAIN)
def test_env_matches_ragen_v2_seed_by_seed(name: str) -> None:
    fx = load_v2(name)
    assert len(fx["episodes"]) >= 100
    env = None
    for ep in fx["episodes"]:
        if env is None or "env_config" in ep:
            env = make_v2(fx["env_type"], {**untag(fx["env_config"]), **ep.get("env_config", {})})
        obs, _ = env.reset(seed=ep["seed"])
        assert obs == ep["obs"], ep["seed"]
        for action, want in zip(ep["actions"], ep["steps"], strict=True):
            obs, reward, terminated, truncated, info = env.step(action)
            where = (ep["seed"], action)
            assert obs == want["obs"], where
            assert reward == untag(want["reward"]), where
            assert (terminated or truncated) == want["done"], where
            ragen_info = untag(want["info"])
            assert {k: info[k] for k in ragen_info} == ragen_info, where


#: RAGEN v2 fixtures of 1,000 seeds x 20 random steps (fewer for the variants), one digest
#: per step; each also keeps three whole episodes
V2_HASHED = ("SimpleSudoku", "MediumSudoku", "SmallSudokuDetailed", "game_2048",
             "game_2048_raw", "rubikscube", "rubikscube_shallow")
#: how the Sudoku fixtures' action codes ``KRCV`` read as text
SUDOKU_TEMPLATES = ("place {v} at row {r} col {c}", "{r},{c},{v}",
                    "place {v} at ({r}, {c}) please", "I think {r} and {c}")


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def _actions(env_type: str, encoded: str) -> list[Any]:
    if env_type == "sudoku":
        return [SUDOKU_TEMPLATES[int(code[0])].format(r=code[1], c=code[2], v=code[3])
                for code in encoded.split()]
    return [int(ch, 16) for ch in encoded]


def _record(env: Any, step: tuple[Any, ...]) -> dict[str, Any]:
    obs, reward, terminated, truncated, info = step
    keys = set(type(env).ragen_info_keys)
    return {"obs": obs, "reward": tagged(reward), "done": terminated or truncated,
            "info": tagged({k: v for k, v in info.items() if k in keys})}


@pytest.mark.parametrize("name", V2_HASHED)
def test_env_matches_ragen_v2_on_many_seeds(name: str) -> None:
    fx = load_v2(f"{name}_sha256")
    env = make_v2(fx["env_type"], untag(fx["env_config"]))
    for ep in fx["examples"]:  # whole texts: a failure here shows what differs
        obs, _ = env.reset(seed=ep["seed"])
        assert obs == ep["obs"], ep["seed"]
        for action, want in zip(ep["actions"], ep["steps"], strict=True):
            assert _record(env, env.step(action)) == want, (ep["seed"], action)
    if name in ("SimpleSudoku", "game_2048", "rubikscube"):
        assert len(fx["episodes"]) >= 1000
    for ep in fx["episodes"]:
        obs, _ = env.reset(seed=ep["seed"])
        assert _digest(obs) == ep["obs"], ep["seed"]
        got = [_digest(_record(env, env.step(a))) for a in _actions(fx["env_type"], ep["actions"])]
        assert len(got) == 20 and " ".join(got) == ep["steps"], ep["seed"]


def test_unknown_env_kwargs_warn_naming_the_env_and_the_key() -> None:
    with pytest.warns(UserWarning, match=r"FrozenLakeEnv: unknown env kwarg 'slipery'"):
        make("frozen_lake", slipery=False)
    with pytest.warns(UserWarning, match=r"BanditEnv: unknown env kwarg 'arms'"):
        make("bandit", arms=3)


# ------------------------------------------------------------------------- live refs
def _gym_room_utils() -> Any:
    from turnpool.bench.envs import load_gym_room_utils

    module = load_gym_room_utils()
    assert module is not None, "gym_sokoban comes with the dev extra"
    return module


class _NumpyWith:
    """numpy, except that ``.random`` is a given local ``RandomState``."""

    def __init__(self, rs: np.random.RandomState) -> None:
        self.random = rs

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)


def test_generator_stages_match_gym_sokoban_live() -> None:
    """Topology and placement: gym_sokoban's own functions, fed local generators."""
    gym = _gym_room_utils()
    for seed in range(300):
        dim = (6 + seed % 3, 6 + seed % 2)
        steps = sokoban_gen.num_gen_steps(*dim)
        gym.random, gym.np = random.Random(seed), _NumpyWith(np.random.RandomState(seed))
        ours_py, ours_rs = random.Random(seed), np.random.RandomState(seed)
        level = gym.room_topology_generation(dim, 0.35, steps)
        floor = sokoban_gen.topology(ours_py, dim[0], dim[1], steps)
        assert bytes(floor) == bytes(level.astype(np.uint8).ravel()), seed
        try:
            room = gym.place_boxes_and_player(level.copy(), num_boxes=2, second_player=False)
        except RuntimeError:
            with pytest.raises(sokoban_gen.GenerationFailed):
                sokoban_gen.place(ours_rs, floor, 2)
            continue
        player, targets = sokoban_gen.place(ours_rs, floor, 2)
        flat = room.ravel()
        assert player == int(np.flatnonzero(flat == 5)[0])
        assert targets == tuple(int(p) for p in np.flatnonzero(flat == 2))


def test_generation_leaves_global_rngs_alone() -> None:
    py_before, np_before = random.getstate(), np.random.get_state()[1].copy()
    sokoban_gen.generate(10003, (8, 8), 2, 10)
    assert random.getstate() == py_before
    assert np.array_equal(np.random.get_state()[1], np_before)


def test_retry_seed_is_cpython_hash_under_pythonhashseed() -> None:
    seeds = [0, 7, 123, 10000, 2**31 + 5, 987654321]
    code = ("import json,sys; print(json.dumps([abs(hash(str(s))) % 2**32 "
            "for s in json.loads(sys.argv[1])]))")
    for hash_seed in (10000, 1):
        out = subprocess.run([sys.executable, "-c", code, json.dumps(seeds)], check=True,
                             capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHONHASHSEED": str(hash_seed)}).stdout
        assert json.loads(out) == [sokoban_gen.ragen_retry_seed(s, hash_seed) for s in seeds]


def test_visual_tiles_are_gym_sokobans() -> None:
    """With gym_sokoban installed, frames are pixel-identical to its ``room_to_rgb``."""
    import importlib.util

    spec = importlib.util.find_spec("gym_sokoban")
    assert spec is not None and spec.submodule_search_locations
    import imageio.v2 as imageio

    surface = Path(next(iter(spec.submodule_search_locations))) / "envs" / "surface"
    env = SokobanEnv(render_mode="rgb_array")
    env.reset(seed=10005)
    frame = env.render("rgb_array")
    assert frame.shape == (96, 96, 3) and frame.dtype == np.uint8
    wall = imageio.imread(surface / "wall.png")
    assert np.array_equal(frame[:16, :16], wall[..., :3])


def test_frozen_lake_matches_gymnasium_live() -> None:
    """Same map and same moves as gymnasium's FrozenLakeEnv seeded the same way."""
    from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as GymLake

    from turnpool.envs.frozen_lake import generate_map

    for seed in range(60):
        slippery = seed % 2 == 0
        desc = generate_map(np.random.default_rng(seed), 4, 0.8)
        gym = GymLake(desc=list(desc), is_slippery=slippery)
        gym.reset(seed=seed)
        ours = make("frozen_lake", is_slippery=slippery, p=0.8,  # gymnasium's (RAGEN v1's)
                    success_rate=1 / 3)
        ours.reset(seed=seed)
        assert ours.desc == desc
        rs = np.random.RandomState(seed)
        for action in rs.randint(1, 5, size=12):
            state, reward, terminated, _, _ = gym.step(int(action) - 1)
            _, r, done, _, _ = ours.step(int(action))
            assert divmod(int(state), 4) == ours.pos and r == reward and done == terminated


@pytest.mark.parametrize("sep", ["||", ","])
def test_prompt_prefixes_are_ragens(sep: str) -> None:
    """The first user message of every RAGEN tag, as RAGEN's ContextManager builds it
    (recorded by running its ``_init_prefix_lookup``)."""
    from turnpool.ragen.config import load_config, rollout_plan
    from turnpool.rollout.prompts import make_env_prompt
    from turnpool.rollout.settings import TurnSettings

    want = load("prefixes")[sep]
    tags = list(want)
    plan = rollout_plan(load_config(overrides=[
        f"es_manager.train.env_configs.tags=[{','.join(tags)}]",
        f"es_manager.train.env_configs.n_groups=[{','.join('1' * len(tags))}]",
        f"es_manager.train.env_groups={len(tags)}"]))
    for spec in plan.tags:
        prompt = make_env_prompt(spec, TurnSettings(action_sep=sep))
        assert prompt.prefix == want[spec.tag]["prefix"], spec.tag
        assert spec.max_tokens == want[spec.tag]["max_tokens"], spec.tag
