"""The facade in a plain script (no ``__main__`` guard) and RAGEN env classes on every backend."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from turnpool.envs.registry import make
from turnpool.ragen.state_manager import EnvStateManager

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]


def _run(script: Path, tmp_path: Path, extra_path: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), extra_path) if p)}
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=240, cwd=tmp_path, env=env)


def test_unguarded_script_starts_no_processes(tmp_path: Path) -> None:
    """RAGEN users write top-level scripts: the facade must not spawn workers that re-run
    them. The envs that ``auto`` would have sent to processes are all here."""
    script = tmp_path / "plain.py"
    script.write_text(textwrap.dedent("""
        import multiprocessing, time
        t0 = time.perf_counter()
        from turnpool.ragen.state_manager import EnvStateManager
        cfg = {"es_manager": {"train": {"env_groups": 3, "group_size": 2, "env_configs": {
               "tags": ["FrozenLake", "Countdown", "MetamathQA"], "n_groups": [1, 1, 1]}}},
               "seed": {"train": 10000}}
        es = EnvStateManager(cfg)
        cache = es.reset()
        out = es.step([{"env_id": 0, "actions": ["Left"], "llm_response": "",
                        "llm_raw_response": ""}])
        print("RAN", es.backend_name, len(multiprocessing.active_children()), len(cache),
              round(time.perf_counter() - t0, 3))
        es.close()
    """))
    proc = _run(script, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout.count("RAN") == 1
    _, backend, children, n_envs, seconds = proc.stdout.split()
    assert (backend, children, n_envs) == ("sequential", "0", "6")
    assert float(seconds) < 10  # imports included; the start itself is a bench figure


RAGEN_STYLE = '''
"""A RAGEN-style env package: config dataclass, env with reset -> obs and a 4-tuple step."""
import random
from dataclasses import dataclass, field


@dataclass
class CoinEnvConfig:
    sides: int = 2
    action_lookup: dict = field(default_factory=lambda: {1: "Heads", 2: "Tails"})


class CoinEnv:
    def __init__(self, config=None):
        self.config = config or CoinEnvConfig()
        self.rng = random.Random(0)
        self.face = 0

    def reset(self, seed=None, mode=None):
        self.rng = random.Random(seed)
        self.face = self.rng.randint(1, self.config.sides)
        return f"guess the coin ({mode})"

    def step(self, action):
        hit = action == self.face
        self.face = self.rng.randint(1, self.config.sides)
        return ("right" if hit else "wrong"), (1.0 if hit else 0.0), hit, {
            "success": hit, "action_is_valid": True}

    def render(self):
        return "guess the coin"


@dataclass
class PaintEnvConfig:
    render_mode: str = "rgb_array"
    action_lookup: dict = field(default_factory=lambda: {1: "Brighter"})


class PaintEnv:
    """An rgb_array env: every frame is one flat colour that encodes seed and step."""

    def __init__(self, config=None):
        self.config = config or PaintEnvConfig()
        self.level = 0

    def frame(self):
        import numpy as np
        return np.full((4, 5, 3), self.level % 256, dtype=np.uint8)

    def reset(self, seed=None, mode=None):
        self.level = int(seed or 0)
        return self.frame()

    def step(self, action):
        self.level += 7
        return self.frame(), 0.5, False, {"success": False}

    def render(self):
        return self.frame()


REGISTERED_ENVS = {"coin": CoinEnv, "paint": PaintEnv}
REGISTERED_ENV_CONFIGS = {"coin": CoinEnvConfig, "paint": PaintEnvConfig}
'''


@pytest.fixture
def ragen_pkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``ragen.env`` with a registered RAGEN-style env, importable here and in workers; the
    modules imported from it are forgotten afterwards (later tests see no RAGEN)."""
    pkg = tmp_path / "pkgs"
    (pkg / "ragen" / "env").mkdir(parents=True)
    (pkg / "ragen" / "__init__.py").write_text("")
    (pkg / "ragen" / "env" / "__init__.py").write_text(RAGEN_STYLE)
    (pkg / "coin_env.py").write_text(RAGEN_STYLE)
    monkeypatch.syspath_prepend(str(pkg))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(pkg), str(ROOT)]))
    for name in [m for m in sys.modules if m == "ragen" or m.startswith("ragen.")]:
        monkeypatch.delitem(sys.modules, name)
    yield pkg
    for name in [m for m in sys.modules if m == "ragen" or m.startswith("ragen.")]:
        del sys.modules[name]  # imported during the test (monkeypatch restores the rest)


def _config(env_type: str, backend: str) -> dict[str, Any]:
    return {"es_manager": {"train": {"env_groups": 2, "group_size": 2,
                                     "env_configs": {"tags": ["Coin"], "n_groups": [2]}}},
            "custom_envs": {"Coin": {"env_type": env_type, "max_actions_per_traj": 3,
                                     "env_instruction": "Guess.", "env_config": {"sides": 2}}},
            "seed": {"train": 100}, "turnpool": {"backend": backend, "ragen_version": "v1"}}


def _play(env_type: str, backend: str) -> list[Any]:
    with EnvStateManager(_config(env_type, backend)) as es:
        trace: list[Any] = [es.reset()]
        for turn in range(3):
            trace.append(es.step([{"env_id": i, "actions": [["heads"], ["Tails", "bogus"]][
                (i + turn) % 2], "llm_response": "", "llm_raw_response": ""} for i in range(4)]))
        trace.append(es.get_rollout_states())
        return [repr(x) for x in trace]


@pytest.mark.parametrize("env_type", ["coin", "coin_env:CoinEnv"])
def test_ragen_env_classes_run_on_every_backend(ragen_pkg: Path, env_type: str) -> None:
    env = make(env_type, sides=2)
    obs, _ = env.reset(seed=5)
    assert obs == "guess the coin (train)"
    _, reward, terminated, truncated, info = env.step("Heads")
    assert reward in (0.0, 1.0) and not truncated and info["success"] == terminated
    assert set(info) == {"success", "action_is_valid", "anchor_obs"}  # nothing invented
    reference = _play(env_type, "sequential")
    assert "'actions': [1]" in reference[1] or "'actions': [2]" in reference[1]
    for backend in ("thread", "process", "process_pool", "joblib"):
        assert _play(env_type, backend) == reference, backend


def test_unknown_names_still_fail_clearly(ragen_pkg: Path) -> None:
    with pytest.raises(KeyError, match="unknown env 'nope'"):
        make("nope")


@pytest.mark.parametrize("backend", ["sequential", "process"])
def test_frames_of_ragen_env_classes_come_through_shared_memory(
        ragen_pkg: Path, backend: str) -> None:
    import numpy as np

    cfg = _config("paint", backend)
    cfg["custom_envs"]["Coin"]["env_config"] = {}
    with EnvStateManager(cfg) as es:
        cache = es.reset()
        first = cache[0]["history"][0]
        assert first["state"] == "<images>" and len(first["images"]) == 1
        assert np.array_equal(np.asarray(first["images"][0]), np.full((4, 5, 3), 100 % 256))
        es.step([{"env_id": i, "actions": ["brighter", "Brighter"], "llm_response": "",
                  "llm_raw_response": ""} for i in range(4)])
        h = es.rollout_cache[3]["history"] if es.rollout_cache else []
        assert h[0]["info"] == {"success": False}  # the frame descriptor is not RAGEN's info
        assert np.array_equal(np.asarray(h[1]["images"][0]), np.full((4, 5, 3), 101 + 14))
        assert es._reader.bytes_copied == 8 * 4 * 5 * 3  # pixels copied once per frame


@pytest.mark.parametrize("env_type", ["coin", "coin_env:CoinEnv"])
def test_env_config_of_ragen_classes_is_not_called_unknown(ragen_pkg: Path,
                                                          env_type: str) -> None:
    import warnings

    from turnpool.ragen.config import load_config, rollout_plan

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither the config nor the envs' construction warns
        plan = rollout_plan(load_config(_config(env_type, "sequential")))
        with EnvStateManager(_config(env_type, "sequential")) as es:
            es.reset()
    assert plan.tags[0].env_kwargs == {"sides": 2}


@pytest.mark.parametrize("mode", ["train", "val"])
def test_ragen_classes_are_reset_with_the_managers_mode(ragen_pkg: Path, mode: str) -> None:
    cfg = _config("coin", "sequential")
    cfg["es_manager"]["val"] = cfg["es_manager"]["train"]
    with EnvStateManager(cfg, mode=mode) as es:
        assert es.reset()[0]["history"][0]["state"] == f"guess the coin ({mode})"


def test_ragen_v2_search_config_in_an_unguarded_script_falls_back_as_auto_does(
        tmp_path: Path) -> None:
    """RAGEN v2's ``_9_search``: SearchQA is ``parallel_friendly`` (``max_workers`` 32), which
    ``auto`` maps to worker processes; a plain script cannot start them, so the manager runs
    sequentially (as ``auto`` itself would) instead of failing at construction."""
    from tests.ragen.test_golden_manager_v2 import write_v2_configs

    write_v2_configs(tmp_path)
    script = tmp_path / "plain_search.py"
    script.write_text(textwrap.dedent("""
        import multiprocessing
        from turnpool.ragen.config import load_config, pool_options
        from turnpool.ragen.state_manager import EnvStateManager
        cfg = load_config("_9_search.yaml", ["es_manager.train.env_groups=2",
                          "es_manager.train.group_size=2",
                          "es_manager.train.env_configs.n_groups=[2]",
                          "custom_envs.SearchQA.env_config.mock_mode=true"])
        print("OPTIONS", pool_options(cfg)["backend"], pool_options(cfg)["fallback"])
        with EnvStateManager(cfg) as es:
            cache = es.reset(seed=0)
            es.step([{"env_id": 0, "actions": ["finish[x]"], "llm_response": "",
                      "llm_raw_response": ""}])
            print("RAN", es.backend_name, len(multiprocessing.active_children()), len(cache))
    """))
    proc = _run(script, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout.count("RAN") == 1
    assert "OPTIONS process True" in proc.stdout
    assert "RAN sequential 0 4" in proc.stdout, proc.stdout
