"""RAGEN-named facades: EnvStateManager (seed 001) and ParallelRolloutManager (seed 002)."""

from __future__ import annotations

import io
from typing import Any

import pytest

from turnpool.ragen.rollout_manager import ParallelRolloutManager
from turnpool.ragen.state_manager import EnvStateManager

pytestmark = pytest.mark.timeout(120)


def _config(tags: list[str], n_groups: list[int], group_size: int, **es: Any) -> dict[str, Any]:
    return {
        "es_manager": {
            "train": {"env_groups": sum(n_groups), "group_size": group_size,
                      "env_configs": {"tags": tags, "n_groups": n_groups}},
            **es,
        },
        "turnpool": {"backend": "sequential", "ragen_version": "v1"},  # v1 rules tested here
        "seed": {"train": 10000, "val": 123},
    }


def _inputs(caches: list[dict[str, Any]], turn: int) -> list[dict[str, Any]]:
    """A fixed script of replies: valid moves, an unknown action, an empty answer."""
    out = []
    for c in caches:
        k = (c["env_id"] + turn) % 4
        actions = [["Left", "Down"], ["Right"], ["Up", "fly"], []][k]
        out.append({"env_id": c["env_id"], "actions": actions,
                    "llm_response": f"<answer>{' || '.join(actions)}</answer>",
                    "llm_raw_response": f"raw {turn}"})
    return out


def _episode(es: EnvStateManager, seed: int | None = None, turns: int = 6) -> list[Any]:
    trace: list[Any] = [es.reset(seed=seed)]
    active = trace[0]
    for turn in range(turns):
        if not active:
            break
        active = es.step(_inputs(active, turn))
        trace.append(active)
    trace.append(es.get_rollout_states())
    return trace


def test_rollout_cache_format_and_ragen_rules() -> None:
    with EnvStateManager(_config(["FrozenLake", "Bandit"], [1, 1], 2)) as es:
        caches = es.reset(seed=40)
        assert [(c["env_id"], c["group_id"], c["tag"], c["penalty"]) for c in caches] == [
            (0, 0, "FrozenLake", 0), (1, 0, "FrozenLake", 0), (2, 1, "Bandit", 0),
            (3, 1, "Bandit", 0)]
        assert caches[0]["history"] == [{"state": caches[0]["history"][0]["state"],
                                         "actions_left": 10}]
        assert es.envs[2]["status"].seed == 41 and es.envs[0]["status"].seed == 40
        out = es.step([
            {"env_id": 0, "actions": ["left", "Dance"], "llm_response": "r0",
             "llm_raw_response": "raw0"},
            {"env_id": 1, "actions": [], "llm_response": "junk", "llm_raw_response": "junk"},
            {"env_id": 2, "actions": ["unicorn"], "llm_response": "u", "llm_raw_response": "u"},
        ])
        by_id = {c["env_id"]: c for c in es.rollout_cache or []}
        # one penalty per turn with any invalid action, none for env 3 (not stepped)
        assert [by_id[i]["penalty"] for i in range(4)] == pytest.approx([-0.1, -0.1, -0.1, 0])
        h0 = by_id[0]["history"]
        assert h0[0]["actions"] == [1] and h0[0]["llm_response"] == "r0"  # ids, as RAGEN
        assert h0[0]["llm_raw_response"] == "raw0" and h0[1]["actions_left"] == 9
        assert by_id[1]["history"][0]["actions"] == [] and by_id[1]["history"][0]["reward"] == 0
        # bandit got an unknown arm: dropped before the env, so the env is not done yet
        assert 2 in {c["env_id"] for c in out}
        out = es.step([{"env_id": 2, "actions": ["Dragon"], "llm_response": "d",
                        "llm_raw_response": "d"}])
        assert out == []  # one pull ends a bandit episode; done envs are not returned
        states = es.get_rollout_states()
        m = states[2]["metrics"]
        assert m["Bandit/success"] == 1.0 and m["Bandit/pass@2"] == 1.0
        assert m["Bandit/num_actions"] == 1 and isinstance(m["Bandit/num_actions"], int)
        assert set(states[0]["metrics"]) == {  # RAGEN's keys, nothing else
            "FrozenLake/success", "FrozenLake/num_actions", "FrozenLake/action_is_effective",
            "FrozenLake/action_is_valid", "FrozenLake/pass@2"}
        per_turn = states[0]["history"][-1]["metrics"]
        assert sorted(per_turn) == ["action_is_effective", "action_is_valid"]
        assert per_turn["action_is_valid"] == [1.0]
        # RAGEN hands out its own dicts (the ContextManager reads and edits them in place)
        assert states[0] is es.rollout_cache[0]


def test_seed_scheme_train_counter_and_constant_val() -> None:
    with EnvStateManager(_config(["Bandit"], [3], 2)) as es:
        def seeds() -> list[int]:
            return [e["status"].seed for e in es.envs]

        es.reset()
        assert seeds() == [10000, 10000, 10001, 10001, 10002, 10002]
        es.reset()
        assert seeds()[0] == 10003  # counter advanced by env_groups
        es.reset(seed=500)
        es.reset()
        # RAGEN: counter = 500 - base + 1, then += env_groups
        assert seeds()[0] == 501 and es.seed_counter == 500 - 10000 + 1 + 3
    cfg = _config(["Bandit"], [2], 1)
    del cfg["seed"]  # no seed section: RAGEN draws a random base per reset
    with EnvStateManager(cfg) as es:
        drawn = set()
        for _ in range(3):
            es.reset()
            drawn.add(es.envs[0]["status"].seed)
            assert es.envs[1]["status"].seed == es.envs[0]["status"].seed + 1
        assert len(drawn) > 1 and all(0 <= s <= 1_000_000 for s in drawn)
    cfg = _config(["Bandit"], [1], 1)
    cfg["es_manager"]["val"] = {"env_groups": 2, "group_size": 1,
                                "env_configs": {"tags": ["Bandit"], "n_groups": [2]}}
    with EnvStateManager(cfg, mode="val") as es:
        es.reset()
        first = [e["status"].seed for e in es.envs]
        es.reset()
        assert [e["status"].seed for e in es.envs] == first == [123, 124]


def test_use_multiprocessing_on_and_off_give_identical_results() -> None:
    cfg = _config(["SimpleSokoban", "FrozenLake", "Bandit", "Countdown"], [1, 1, 1, 1], 3)
    del cfg["turnpool"]
    results = {}
    for mp in (False, True):
        cfg["es_manager"].update(use_multiprocessing=mp, max_workers=2)
        with EnvStateManager(cfg) as es:
            assert (es.backend_name == "process_pool") == mp
            results[mp] = [_episode(es), _episode(es)]
    assert results[True] == results[False]
    assert results[False][0][-1] != results[False][1][-1]  # fresh seeds for the second reset


def test_use_multiprocessing_switch_takes_effect_at_reset() -> None:
    cfg = _config(["Bandit"], [1], 2)
    del cfg["turnpool"]
    cfg["es_manager"].update(use_multiprocessing=True, max_workers=1,
                             sequential_env_types=["bandit"])
    with EnvStateManager(cfg) as es:
        a = _episode(es, seed=9)
        es.use_multiprocessing = False
        assert es.backend_name == "process_pool"
        b = _episode(es, seed=9)
        assert es.backend_name != "process_pool"
        assert a == b


def test_parallel_rollout_manager_matches_sequential_rollouts() -> None:
    cfg = _config(["FrozenLake", "Bandit"], [2, 1], 3)
    del cfg["turnpool"]
    cfg["agent_proxy"] = {"use_parallel_rollout": True, "parallel_n_jobs": 2}
    texts = {}
    for parallel in (True, False):
        cfg["agent_proxy"]["use_parallel_rollout"] = parallel
        cfg["turnpool"] = {} if parallel else {"backend": "sequential"}
        with ParallelRolloutManager(cfg, overrides=["turnpool.policy.name=random"]) as prm:
            assert prm.backend_name == ("joblib" if parallel else "sequential")
            batch = prm.rollout(seed=3)
        buf = io.StringIO()
        batch.to_jsonl(buf)
        texts[parallel] = buf.getvalue()
        assert len(batch.trajectories) == 9
    assert texts[True] == texts[False]


def test_an_env_info_key_the_pool_also_uses_reaches_history_and_metrics() -> None:
    """Sudoku reports ``error`` (a string) for a bad move; RAGEN v2's manager keeps the key
    (its metric is 0.0, no numeric value), so turnpool's must not drop it as a pool key."""
    cfg = {"es_manager": {"train": {"env_groups": 1, "group_size": 1,
                                    "env_configs": {"tags": ["SimpleSudoku"], "n_groups": [1]}}},
           "custom_envs": {"SimpleSudoku": {"env_type": "sudoku", "max_actions_per_traj": 5,
                                            "env_instruction": "", "max_tokens": 10,
                                            "env_config": None}},
           "turnpool": {"backend": "sequential"}}
    with EnvStateManager(cfg, mode="train") as es:
        es.reset(seed=3)
        es.step([{"env_id": 0, "actions": ["9,9,9"], "llm_response": "",
                  "llm_raw_response": ""}])
        state = es.get_rollout_states()[0]
    assert isinstance(state["history"][0]["info"]["error"], str)
    assert state["metrics"]["SimpleSudoku/error"] == 0.0
