"""RAGEN v2's dataset envs (MetaMathQA, Countdown, DeepCoder) against traces recorded from its
own classes (``tests/fixtures/ragen_v2/envs``, README there): ``turnpool.make`` with the tag's
env_config and the same rows gives the same observation, render text, reward (type
included), done flag and every info value RAGEN's env reports, seed by seed."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.ragen.golden import untag
from tests.ragen.test_golden_envs import V2_FIXTURES, load_v2, make_v2
from tests.ragen.test_golden_es import BUNDLED_COUNTDOWN
from turnpool import make

BUNDLED_DEEPCODER = BUNDLED_COUNTDOWN.with_name("deepcoder.jsonl")


def deepcoder_folder(tmp_path: Path) -> Path:
    """The bundled problems as RAGEN v2 prepares a DeepCoder row (``question`` = the problem,
    then ``Starter code:`` and the code), in a dataset folder whose ``test`` split RAGEN's
    ``load_dataset(dataset_path)`` reads."""
    folder = tmp_path / "deepcoder"
    folder.mkdir()
    with (folder / "test.jsonl").open("w", encoding="utf-8") as out:
        for line in BUNDLED_DEEPCODER.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            starter = row["starter_code"]
            question = (f"{row['problem']}\n\nStarter code:\n{starter}" if starter
                        else row["problem"])
            out.write(json.dumps({"question": question, "ground_truth": row["tests"],
                                  "starter_code": starter, "metadata": row["metadata"]}) + "\n")
    return folder


#: a frame of the harness (RAGEN's a random temporary file, turnpool's ``harness.py``): its
#: ``File`` line and the source and caret lines under it
_FRAMES = re.compile(r'  File "(?:harness\.py|/tmp/deepcoder_debug/solution_[^"]*\.py)", '
                     r"line \d+, in .*\n(?:    .*\n)*")


def traceback_free(text: str) -> str:
    """A runtime error's feedback without the harness's frames, which are each harness's own:
    the reply's frames (``File "<string>"``, with their source and carets) and the exception
    line stay."""
    return _FRAMES.sub("", text)


def data_config(env_type: str, tmp_path: Path) -> dict[str, Any]:
    """Where the recorded rows are: RAGEN read the bundled Countdown rows as its default
    ``data/countdown/train.parquet`` and MetaMathQA's hub set replaced by the bundled sample
    (turnpool's default)."""
    if env_type == "countdown":  # a copy: turnpool keeps every row of its own bundled file
        data = tmp_path / "countdown.jsonl"
        data.write_text(BUNDLED_COUNTDOWN.read_text(encoding="utf-8"), encoding="utf-8")
        return {"train_path": str(data)}
    if env_type == "deepcoder":
        return {"dataset_path": str(deepcoder_folder(tmp_path))}
    return {}


@pytest.mark.parametrize("name", ["MetamathQA", "Countdown", "DeepCoder", "DeepCoderTwoSteps"])
def test_dataset_env_matches_ragen_v2_seed_by_seed(name: str, tmp_path: Path) -> None:
    fx = load_v2(name)
    config = {**untag(fx["env_config"]), **data_config(fx["env_type"], tmp_path)}
    # MetamathQA's v2 env_config is null: plain ``make`` must be v2's env (no attempt limit)
    env = make(fx["env_type"], **config) if name == "MetamathQA" else make_v2(fx["env_type"],
                                                                              config)
    try:
        for ep in fx["episodes"]:
            obs, _ = env.reset(seed=ep["seed"])
            assert obs == ep["obs"] == env.render(), ep["seed"]
            for action, want in zip(ep["actions"], ep["steps"], strict=True):
                obs, reward, terminated, truncated, info = env.step(action)
                where = (ep["seed"], action)
                # the observation is what RAGEN's manager shows, its render() (RAGEN's
                # DeepCoder answers "Invalid action." to an empty reply, and renders the
                # problem with the feedback)
                assert obs == env.render(), where
                assert traceback_free(obs) == traceback_free(want["render"]), where
                assert reward == untag(want["reward"]), where
                assert (terminated or truncated) == want["done"], where
                ragen_info = untag(want["info"])
                assert {k: info.get(k) for k in ragen_info if k != "detail"} == {
                    k: v for k, v in ragen_info.items() if k != "detail"}, where
                if "detail" in ragen_info:
                    assert traceback_free(info["detail"]) == traceback_free(
                        ragen_info["detail"]), where
    finally:
        env.close()


def test_the_recorded_episodes_cover_each_outcome() -> None:
    """The traces are worth comparing: right, partly right and wrong replies, and episodes
    that go on after a wrong answer."""
    rewards = {name: {json.dumps(s["reward"]) for ep in load_v2(name)["episodes"]
                      for s in ep["steps"]}
               for name in ("MetamathQA", "Countdown", "DeepCoder")}
    assert {'{"float": 1.0}', '{"float": 0.5}', '{"float": 0.0}'} <= rewards["MetamathQA"]
    assert {"0", "1", '{"float": 0.1}'} <= rewards["Countdown"]
    assert len(rewards["DeepCoder"]) >= 2
    two = load_v2("DeepCoderTwoSteps")["episodes"]
    assert any(len(ep["steps"]) == 2 for ep in two)
    assert V2_FIXTURES.is_dir()


def test_deepcoder_reports_every_info_key_ragen_v2_averages(tmp_path: Path) -> None:
    """RAGEN v2's loop averages every info key of its DeepCoder env into the metrics
    (``DeepCoder/passed_tests``, ``.../runnable``, ...; ``detail`` is text, skipped but kept
    as a key), so the manager passes them all on; turnpool's own ``sandbox_outcome`` stays
    out."""
    from turnpool.ragen.state_manager import EnvStateManager

    cfg = {"es_manager": {"train": {"env_groups": 1, "group_size": 2, "env_configs": {
        "tags": ["DeepCoder"], "n_groups": [1]}}},
        "custom_envs": {"DeepCoder": {"env_type": "deepcoder", "max_actions_per_traj": 1,
                                      "env_instruction": "Code.", "env_config": {
                                          "max_steps": 1,
                                          "dataset_path": str(deepcoder_folder(tmp_path))}}},
        "collapse_detection": {}, "turnpool": {"backend": "sequential"},
        "seed": {"train": 10000, "val": 123}}
    with EnvStateManager(cfg, mode="train") as es:
        es.reset(seed=10000)
        es.step([{"env_id": 0, "actions": ["print(input())"], "llm_response": "",
                  "llm_raw_response": ""},
                 {"env_id": 1, "actions": [""], "llm_response": "", "llm_raw_response": ""}])
        states = es.get_rollout_states()
    ran, empty = (s["history"][0]["info"] for s in states)
    assert set(ran) == {"action_is_effective", "action_is_valid", "success", "detail",
                        "passed_tests", "total_tests", "runnable", "pass_reward", "raw_reward"}
    assert set(empty) == {"action_is_effective", "action_is_valid", "success", "error",
                          "raw_reward"}
    assert {"DeepCoder/passed_tests", "DeepCoder/total_tests", "DeepCoder/runnable",
            "DeepCoder/pass_reward"} <= set(states[0]["metrics"])
