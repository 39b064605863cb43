"""turnpool's ``EnvStateManager`` against full traces of RAGEN's own ``es_manager`` (recorded
from RAGEN's code; see docs/ragen.md): every returned dict, number type, status, metric and
seed counter must be the same."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.ragen.golden import load
from turnpool.ragen.state_manager import EnvStateManager

pytestmark = pytest.mark.timeout(300)

BUNDLED_COUNTDOWN = Path(__file__).resolve().parents[2] / "turnpool" / "data" / "countdown.jsonl"


def encode(x: Any) -> Any:
    """The recorder's encoding: floats, numpy scalars, dataclasses and images tagged."""
    from PIL import Image

    if isinstance(x, Image.Image):
        a = np.asarray(x)
        return {"pil_image_sha256": hashlib.sha256(a.tobytes()).hexdigest(),
                "shape": list(a.shape), "mode": x.mode}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {"dataclass": type(x).__name__,
                **{f.name: encode(getattr(x, f.name)) for f in dataclasses.fields(x)}}
    if isinstance(x, dict):
        return {str(k): encode(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [encode(v) for v in x]
    if isinstance(x, np.bool_):
        return {"np_bool": bool(x)}
    if isinstance(x, np.integer):
        return {"np_int": int(x)}
    if isinstance(x, np.floating):
        return {"np_float": float(x)}
    if isinstance(x, float):
        return {"float": x}
    return x


def _config(trace: dict[str, Any], tmp_path: Path, backend: str) -> dict[str, Any]:
    cfg = json.loads(json.dumps(trace["config"]))
    used = cfg["es_manager"]["train"]["env_configs"]["tags"]
    cfg["custom_envs"] = {k: v for k, v in cfg["custom_envs"].items() if k in used}
    for c in cfg["custom_envs"].values():
        if c.get("env_config") and "train_path" in c["env_config"]:
            data = tmp_path / "countdown.jsonl"
            data.write_text(BUNDLED_COUNTDOWN.read_text(encoding="utf-8"), encoding="utf-8")
            c["env_config"]["train_path"] = str(data)
    cfg["turnpool"] = {"backend": backend, "ragen_version": "v1"}  # recorded from v1
    return cfg


def replay(name: str, tmp_path: Path, backend: str = "sequential") -> None:
    trace = load(f"es_{name}")
    with EnvStateManager(_config(trace, tmp_path, backend)) as es:
        assert [sorted(e) for e in es.envs] == trace["envs_before_reset"]
        for k, o in enumerate(trace["ops"]):
            op, arg = o["op"], o["arg"]
            if op == "reset":
                res: Any = es.reset(seed=arg)
            elif op == "step":
                res = es.step(arg)
            elif op == "rollout_states":
                res = es.get_rollout_states()
            elif op == "envs":
                res = [{k: v for k, v in e.items() if k not in ("env", "config")}
                       for e in es.envs]
            else:
                res = es.seed_counter
            assert json.loads(json.dumps(encode(res))) == o["result"], (name, k, op)


@pytest.mark.parametrize("name", ["mix_sokoban_bandit", "frozen_lake", "countdown",
                                  "metamathqa", "visual_sokoban"])
def test_state_manager_matches_ragen_trace(name: str, tmp_path: Path) -> None:
    replay(name, tmp_path)


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_trace_is_the_same_on_worker_backends(backend: str, tmp_path: Path) -> None:
    replay("mix_sokoban_bandit", tmp_path, backend)
    replay("visual_sokoban", tmp_path, backend)
