"""turnpool's ``EnvStateManager`` and collector against RAGEN v2's own manager (mll-lab-nu/RAGEN
@ 20daedc), recorded at the ``EnvStateManager`` + ``ContextManager`` level with a scripted actor
that mixes valid, invalid, unformatted and multi-action replies (docs/ragen.md, "Recording the
fixtures again"): the rollout cache after every call, the metrics, and the prompts."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.ragen.test_golden_es import BUNDLED_COUNTDOWN, encode
from turnpool.envs.registry import make
from turnpool.ragen.state_manager import EnvStateManager

pytestmark = pytest.mark.timeout(300)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ragen_v2" / "manager"
#: every recorded trace: a v2 config builds FrozenLake with v2's ``p``/``success_rate`` and
#: Bandit with v2's arm names and per-instance ``internal_seed`` (train envs, then val)
NATIVE = ["sokoban", "countdown", "frozen_lake", "bandit"]
#: the train seed each trace was recorded with (val uses ``seed.val``)
SEEDS = {"sokoban": 7, "countdown": 3, "frozen_lake": 11, "bandit": 5}


@cache
def trace(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    return data


def config(name: str, tmp_path: Path, backend: str = "sequential") -> dict[str, Any]:
    cfg = json.loads(json.dumps(trace(name)["config"]))
    for c in cfg["custom_envs"].values():
        if c.get("env_config") and "train_path" in c["env_config"]:
            data = tmp_path / "countdown.jsonl"
            data.write_text(BUNDLED_COUNTDOWN.read_text(encoding="utf-8"), encoding="utf-8")
            c["env_config"]["train_path"] = str(data)
    cfg["turnpool"] = {"backend": backend}
    return cfg


def plain(x: Any) -> Any:
    return json.loads(json.dumps(encode(x)))


def replay(name: str, tmp_path: Path, backend: str = "sequential") -> None:
    for run in trace(name)["runs"]:
        mode = run["mode"]
        with EnvStateManager(config(name, tmp_path, backend), mode=mode) as es:
            assert es.v2
            out = es.reset(seed=run_seed(name, mode))
            assert plain(out) == run["reset"], (name, mode, "reset")
            for k, turn in enumerate(run["turns"]):
                out = es.step(turn["env_inputs"])
                assert [o["env_id"] for o in out] == turn["active_after"], (name, mode, k)
            got = plain(es.get_rollout_states())
            for g, want in zip(got, run["rollout_states"]):
                assert g["history"] == want["history"], (name, mode, g["env_id"])
                assert g["metrics"] == want["metrics"], (name, mode, g["env_id"])
            assert got == run["rollout_states"]


def run_seed(name: str, mode: str) -> int | None:
    return SEEDS[name] if mode == "train" else None


@pytest.mark.parametrize("name", NATIVE)
def test_state_manager_matches_ragen_v2_manager(name: str, tmp_path: Path) -> None:
    replay(name, tmp_path)


@pytest.mark.parametrize("name", ["sokoban", "bandit"])
def test_v2_trace_is_the_same_on_the_process_backend(name: str, tmp_path: Path) -> None:
    """Bandit: group members numbered apart each reset themselves in the workers too."""
    replay(name, tmp_path, "process")


def write_v2_configs(dest: Path) -> list[str]:
    """RAGEN v2's ``config/*.yaml`` as recorded (parsed and dumped again), written back."""
    files = json.loads((FIXTURES / "configs.json").read_text(encoding="utf-8"))
    for name, text in files.items():
        (dest / name).write_text(text, encoding="utf-8")
    return sorted(files)


def test_every_ragen_v2_config_loads_untouched_as_v2(tmp_path: Path) -> None:
    import warnings

    from turnpool.ragen.config import load_config, rollout_plan

    names = write_v2_configs(tmp_path)
    assert len(names) == 19
    for name in names:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # every key is known: no warning of any kind
            cfg = load_config(tmp_path / name)
            plan = rollout_plan(cfg, "val")
        assert cfg.turnpool.ragen_version == "v2", name
        assert plan.collector.turn.ragen_version == "v2"
    base = rollout_plan(load_config(tmp_path / "base.yaml"))
    assert base.collector.turn.max_actions_per_turn == 2  # v2's base value, not v1's 5
    assert base.tags[0].tag == "CoordSokoban"


def test_a_pinned_version_wins_over_the_detected_one(tmp_path: Path) -> None:
    from turnpool.ragen.config import load_config

    write_v2_configs(tmp_path)
    cfg = load_config(tmp_path / "_2_sokoban.yaml", ["turnpool.ragen_version=v1"])
    assert cfg.turnpool.ragen_version == "v1"


def test_the_version_is_detected_from_keys_only_one_ragen_has() -> None:
    from turnpool.ragen.config import load_config

    v1 = {"es_manager": {"use_multiprocessing": False}}
    v2 = {"agent_proxy": {"context_window_mode": "single_turn"}}
    assert load_config(v1).turnpool.ragen_version == "v1"
    assert load_config(v2).turnpool.ragen_version == "v2"
    assert load_config({}).turnpool.ragen_version == "v2"  # neither: the default
    both = {**v1, **v2}
    assert load_config(both).turnpool.ragen_version == "v2"


def test_parallel_friendly_tags_run_on_worker_processes_with_their_max_workers() -> None:
    from turnpool.ragen.config import load_config, pool_options

    def cfg(friendly: bool, workers: int) -> dict[str, Any]:
        return {"custom_envs": {"SimpleSokoban": {"parallel_friendly": friendly,
                                                  "max_workers": workers}}}
    # still auto's choice: it falls back to sequential where processes cannot start
    assert pool_options(load_config(cfg(True, 3))) == {"backend": "process", "num_workers": 3,
                                                       "fallback": True}
    pinned = {**cfg(True, 3), "turnpool": {"fallback": False}}
    assert pool_options(load_config(pinned))["fallback"] is False
    assert pool_options(load_config(cfg(False, 32))).get("backend", "auto") == "auto"
    assert pool_options(load_config(cfg(True, 1))).get("backend", "auto") == "auto"


class ScriptedActor:
    """Replies what the recorded actor replied to env ``env_id`` at turn ``turn``, and keeps
    every prompt it was shown."""

    def __init__(self, run: dict[str, Any]) -> None:
        self.replies = {(i, k): "<think>" + r  # v2 prepends the generation prompt's tag
                        for k, t in enumerate(run["turns"])
                        for i, r in zip(t["env_ids"], t["replies"])}
        self.seen: dict[tuple[int, int], Any] = {}

    def generate(self, batch: list[Any], contexts: list[Any] | None = None) -> list[str]:
        assert contexts is not None
        for messages, c in zip(batch, contexts):
            self.seen[(c.env_id, c.turn)] = messages
        return [self.replies[(c.env_id, c.turn)] for c in contexts]

    def close(self) -> None:
        pass


@pytest.mark.parametrize("window", [("full", -1, 0), ("full", -1, 1),
                                    ("limited_multi_turn", 2, 0), ("single_turn", 2, 0),
                                    ("single_turn", -1, 0)])
def test_collector_prompts_are_ragen_v2_context_managers(window: tuple[str, int, int],
                                                         tmp_path: Path) -> None:
    """Run 0 is train mode (seed 7), run 1 val mode (``seed.val``)."""
    from turnpool.ragen.config import load_config, rollout_plan
    from turnpool.rollout.collector import TrajectoryCollector

    name = f"sokoban_{window[0]}_{window[1]}".replace("-", "m")
    if window[:2] == ("full", -1):
        name = "sokoban"
    run = trace(name)["runs"][window[2]]
    cfg = load_config(config(name, tmp_path))
    actor = ScriptedActor(run)
    with TrajectoryCollector.from_plan(rollout_plan(cfg, run["mode"]), actor) as col:
        batch = col.collect(seed=run_seed("sokoban", run["mode"]))
    for k, t in enumerate(run["turns"]):
        for i, want in zip(t["env_ids"], t["messages"]):
            assert actor.seen[(i, k)] == want, (name, i, k)
    assert len(actor.seen) == sum(len(t["env_ids"]) for t in run["turns"])
    got = {t.env_id: t.score for t in batch.trajectories}
    want_rewards = {s["env_id"]: sum(h.get("reward", 0) if not isinstance(h.get("reward"), dict)
                                     else h["reward"]["float"] for h in s["history"])
                    for s in run["rollout_states"]}
    assert got == pytest.approx(want_rewards)
    # v2's episode scores (its rm_scores at the last token): rewards + penalty, normalized
    scores = {t.env_id: t.normalized_score for t in batch.trajectories}
    assert [scores[s["env_id"]] for s in run["rollout_states"]] == pytest.approx(
        [x["float"] for x in run["scores"]], abs=1e-6)
    v2_keys = ("raw_reward", "episodic_return", "manager_invalid_action")
    want_metrics = {k: v["np_float"] if isinstance(v, dict) and "np_float" in v else
                    v["float"] if isinstance(v, dict) else v
                    for k, v in run["metrics"].items()
                    if k.split("/")[-1] in v2_keys or k.startswith("charts/")}
    assert {k for k in want_metrics if "manager_invalid_action" in k} == {
        "SimpleSokoban/manager_invalid_action", "SimpleSokoban/non-zero/manager_invalid_action",
        "LargerSokoban/manager_invalid_action", "LargerSokoban/non-zero/manager_invalid_action"}
    assert {k: batch.metrics.get(k) for k in want_metrics} == pytest.approx(want_metrics)


def _tile_config(**ap: Any) -> dict[str, Any]:
    return {"es_manager": {"train": {"env_groups": 1, "group_size": 2,
                                     "env_configs": {"tags": ["Tiles"], "n_groups": [1]}}},
            "custom_envs": {"Tiles": {"env_type": "tests.ragen.v2_envs:TileEnv",
                                      "max_actions_per_traj": 6}},
            "agent_proxy": {"max_turn": 3, "max_actions_per_turn": 3, **ap},
            "turnpool": {"backend": "sequential"}}


def test_a_multi_action_turn_merges_every_actions_info_and_sums_raw_reward() -> None:
    with EnvStateManager(_tile_config()) as es:
        es.reset(seed=1)
        es.step([{"env_id": 0, "actions": ["grow", "grow"], "llm_response": "",
                  "llm_raw_response": ""},
                 {"env_id": 1, "actions": ["fly"], "llm_response": "", "llm_raw_response": ""}])
        assert es.rollout_cache is not None
        h0, h1 = es.rollout_cache[0]["history"], es.rollout_cache[1]["history"]
        # the first action's own key survives the second action's info
        want = {"raw_reward": 12.0, "score": 12, "grid": [[8, 0]], "note": "grew to 8",
                "step_4": 1.0, "step_8": 1.0}
        assert {k: h0[0]["info"].get(k) for k in want} == want
        assert h0[0]["reward"] == pytest.approx(0.2)
        assert h1[0]["info"] == {"raw_reward": 0.0, "manager_invalid_action": True}
        assert h1[1]["manager_invalid_action"] is True and "manager_invalid_action" not in h0[1]
        es.step([{"env_id": 0, "actions": ["stop"], "llm_response": "", "llm_raw_response": ""}])
        m = es.get_rollout_states()[0]["metrics"]
    # "note" is text: logged and skipped, not a crash; the grid gives max_tile
    assert m["Tiles/note"] == 0.0
    assert m["Tiles/max_tile"] == 8 and m["Tiles/final_score"] == 12.0
    assert m["Tiles/episodic_return"] == 12.0 and m["Tiles/raw_reward"] == 6.0
    assert m["Tiles/success"] == 1.0


def test_v1_keeps_the_last_actions_info_and_no_v2_keys() -> None:
    cfg = _tile_config()
    cfg["turnpool"]["ragen_version"] = "v1"
    with EnvStateManager(cfg) as es:
        es.reset(seed=1)
        es.step([{"env_id": 0, "actions": ["grow", "grow"], "llm_response": "",
                  "llm_raw_response": ""}])
        assert es.rollout_cache is not None
        assert "step_4" not in es.rollout_cache[0]["history"][0]["info"]
        assert "manager_invalid_action" not in es.rollout_cache[1]["history"][-1]


def test_collector_reports_v2_metrics_from_the_episodes() -> None:
    from turnpool.ragen.config import load_config, rollout_plan
    from turnpool.rollout.collector import TrajectoryCollector

    class Actor:
        def generate(self, batch: list[Any], contexts: list[Any] | None = None) -> list[str]:
            assert contexts is not None
            return ["<think>a</think><answer>grow || grow</answer>" if c.env_id == 0
                    else "<think>b</think><answer>jump</answer>" for c in contexts]

        def close(self) -> None:
            pass

    cfg = load_config(_tile_config())
    with TrajectoryCollector.from_plan(rollout_plan(cfg), Actor()) as col:
        batch = col.collect(seed=1)
        m = batch.metrics
        second = batch.trajectories[0].messages
    # env 0: 3 turns of two grows (4+8, 16+32, 64+128); env 1: 3 invalid turns
    assert m["Tiles/episodic_return"] == pytest.approx((12 + 48 + 192) / 2)
    assert m["Tiles/manager_invalid_action"] == pytest.approx(0.5)
    assert m["Tiles/non-zero/manager_invalid_action"] == pytest.approx(1.0)
    assert m["Tiles/max_tile"] == 128.0 and m["rollout/max_tile"] == 128.0
    assert m["Tiles/final_score"] == float(4 + 8 + 16 + 32 + 64 + 128)
    assert m["charts/avg_episode_return"] == m["Tiles/episodic_return"]
    assert second[0]["role"] == "system" and second[1]["content"].startswith("\nTurn 1:")


def test_an_env_kwarg_the_env_does_not_have_warns_once_naming_env_and_key() -> None:
    """The env's construction warns (`TextEnv.extra_kwargs`), once for a tag's many envs;
    loading the config does not warn a second time."""
    import warnings

    from turnpool.ragen.config import load_config, rollout_plan

    cfg = {"es_manager": {"train": {"env_groups": 2, "group_size": 2, "env_configs": {
               "tags": ["FrozenLake"], "n_groups": [2]}}},
           "custom_envs": {"FrozenLake": {"env_config": {"success_rate": 0.8,
                                                         "slipery": True}}},
           "turnpool": {"backend": "sequential"}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        rollout_plan(load_config(cfg))
        assert caught == []
        with EnvStateManager(cfg) as es:
            es.reset(seed=1)
    msgs = [str(w.message) for w in caught]
    assert msgs == ["FrozenLakeEnv: unknown env kwarg 'slipery' ignored"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with EnvStateManager(load_config({"turnpool": {"backend": "sequential"}})) as es:
            es.reset(seed=1)  # the packaged configs' keys are all known


def _two_modes(**tp: Any) -> dict[str, Any]:
    def es(n: int) -> dict[str, Any]:
        return {"env_groups": n, "group_size": 2,
                "env_configs": {"tags": ["Bandit", "FrozenLake"], "n_groups": [n - 1, 1]}}
    return {"es_manager": {"train": es(3), "val": es(2)}, "turnpool": tp,
            "custom_envs": {"FrozenLake": {"env_config": {"is_slippery": True}}}}


def test_a_v2_config_numbers_bandits_across_train_then_val_and_adds_v2_defaults() -> None:
    from turnpool.ragen.config import load_config, rollout_plan

    cfg = load_config(_two_modes())
    train, val = rollout_plan(cfg, "train"), rollout_plan(cfg, "val")
    assert [m["internal_seed"] for m in train.tags[0].member_kwargs] == [0, 1, 2, 3]
    assert [m["internal_seed"] for m in val.tags[0].member_kwargs] == [4, 5]
    assert train.tags[1].member_kwargs == ()  # FrozenLake is not numbered
    assert train.tags[0].env_kwargs["split"] == "train"
    lake = make("frozen_lake", **train.tags[1].env_kwargs)  # v2's are FrozenLake's own
    assert (lake.p, lake.success_rate, lake.is_slippery) == (0.9, 0.8, True)
    assert lake.p == make("frozen_lake").p


def test_a_v1_config_builds_envs_as_before() -> None:
    from turnpool.ragen.config import load_config, rollout_plan

    plan = rollout_plan(load_config(_two_modes(ragen_version="v1")), "val")
    assert [t.member_kwargs for t in plan.tags] == [(), ()]
    assert "split" not in plan.tags[0].env_kwargs
    lake = plan.tags[1].env_kwargs  # v1's FrozenLake: gymnasium's map and slip odds
    assert (lake["p"], lake["success_rate"]) == (0.8, 1 / 3)


def _game_2048_config() -> dict[str, Any]:
    return {"es_manager": {"train": {"env_groups": 2, "group_size": 1, "env_configs": {
                "tags": ["game_2048"], "n_groups": [2]}}},
            "custom_envs": {"game_2048": {"env_type": "game_2048",
                                          "max_actions_per_traj": 20}},
            "agent_proxy": {"max_turn": 4, "max_actions_per_turn": 2},
            "seed": {"train": 3}, "turnpool": {"backend": "sequential"}}


def test_a_v2_rollout_over_game_2048_reports_max_tile_and_final_score() -> None:
    """The native 2048 env reports RAGEN v2's ``grid`` and ``score``: the manager and the
    collector turn them into ``{tag}/max_tile`` (the last grid's largest tile) and
    ``{tag}/final_score`` (the last score)."""
    from turnpool.ragen.config import load_config, rollout_plan
    from turnpool.rollout.collector import TrajectoryCollector

    moves = ["Up", "Left", "Down", "Right"]
    with EnvStateManager(_game_2048_config()) as es:
        es.reset()
        for k in range(4):
            es.step([{"env_id": i, "actions": [moves[(k + i) % 4], moves[(k + i + 1) % 4]],
                      "llm_response": "", "llm_raw_response": ""} for i in range(2)])
        assert es.rollout_cache is not None
        states = es.get_rollout_states()
    for s in states:
        infos = [h["info"] for h in s["history"] if "info" in h]
        assert s["metrics"]["game_2048/max_tile"] == int(np.max(infos[-1]["grid"])) >= 4
        assert s["metrics"]["game_2048/final_score"] == float(infos[-1]["score"]) > 0

    class Actor:
        def generate(self, batch: list[Any], contexts: list[Any] | None = None) -> list[str]:
            assert contexts is not None
            return [f"<think>t</think><answer>{moves[c.turn % 4]} || {moves[(c.turn + 1) % 4]}"
                    "</answer>" for c in contexts]

        def close(self) -> None:
            pass

    with TrajectoryCollector.from_plan(rollout_plan(load_config(_game_2048_config())),
                                       Actor()) as col:
        batch = col.collect(seed=3)
    last = [[t.info for t in tr.turns if "grid" in t.info][-1] for tr in batch.trajectories]
    assert batch.metrics["game_2048/max_tile"] == pytest.approx(
        np.mean([np.max(i["grid"]) for i in last])) and batch.metrics["game_2048/max_tile"] >= 4
    assert batch.metrics["game_2048/final_score"] == pytest.approx(
        np.mean([float(i["score"]) for i in last])) and batch.metrics["game_2048/final_score"] > 0
