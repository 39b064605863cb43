"""Same seed -> byte-identical episodes in any process, under any PYTHONHASHSEED.

For each built-in env, 200 seeded resets plus a short fixed action sequence are reduced to one
sha256 digest. The digest is computed in this process, in two fresh interpreters started with
``PYTHONHASHSEED=1`` and ``=2`` (salted ``hash()`` differs there, which is how RAGEN's
``hash(str(seed))`` retry seeds broke), and in a ``multiprocessing`` spawn worker. All must
agree. The children import this file by path, so they run exactly the code below.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

N_SEEDS = 200
#: env name -> (make kwargs, fixed action sequence stepped after each reset until done).
CASES: dict[str, tuple[dict[str, Any], list[Any]]] = {
    "sokoban": ({"dim_room": (6, 6), "num_boxes": 1}, [1, 4, 2, 3, "Up", "left"]),
    "frozen_lake": ({}, [2, 3, 2, 3, "Down", "right"]),
    "bandit": ({}, ["dragon"]),
    "countdown": ({}, ["1 + 2 * 3"]),
    "metamathqa": ({}, ["42"]),
    "sudoku": ({"render_format": "with_feedback"}, ["place 5 at row 1 col 1", "2,3,4", "1,1,1"]),
    "game_2048": ({}, [0, 1, "Down", "left", 0, 1]),
    "rubikscube": ({}, [1, 4, "R'", "f"]),
    "bandit_v2": ({"split": "test", "internal_seed": 3}, [1]),
}
#: At least this many of the 200 per-seed records must differ, so a constant env cannot pass
#: (bandit: two arm orders x the high arm paying or not).
MIN_DISTINCT = {"sokoban": 150, "frozen_lake": 150, "bandit": 4, "countdown": 150,
                "metamathqa": 100, "sudoku": 150, "game_2048": 150, "rubikscube": 150,
                "bandit_v2": 8}
CHILD_TIMEOUT_S = 120
REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(300)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=repr, ensure_ascii=True)


def episode_records(env_name: str, fresh_env_per_seed: bool = False) -> list[str]:
    """One canonical text per seed: the reset obs and info, then every step's full result."""
    import turnpool

    kwargs, actions = CASES[env_name]
    env_type = env_name.removesuffix("_v2")
    env = turnpool.make(env_type, **kwargs)
    records = []
    try:
        for seed in range(N_SEEDS):
            if fresh_env_per_seed:
                env.close()
                env = turnpool.make(env_type, **kwargs)
            obs, info = env.reset(seed=seed)
            parts: list[Any] = [obs, info]
            for action in actions:
                obs, reward, terminated, truncated, info = env.step(action)
                parts.append([obs, reward, terminated, truncated, info])
                if terminated or truncated:
                    break
            records.append(_canonical(parts))
    finally:
        env.close()
    return records


def digest(records: list[str]) -> str:
    h = hashlib.sha256()
    for record in records:
        h.update(record.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.hexdigest()


def all_digests() -> dict[str, Any]:
    """Digest per env (or the error text), plus this interpreter's string hash salt probe."""
    out: dict[str, Any] = {"hash_probe": hash("turnpool determinism probe")}
    for name in CASES:
        try:
            out[name] = digest(episode_records(name))
        except Exception as exc:  # reported per env so one broken env fails only its test
            out[name] = f"error: {type(exc).__name__}: {exc}"
    return out


def _run_child(hash_seed: str, out_dir: Path) -> dict[str, Any]:
    out_file = out_dir / f"digests_{hash_seed}.json"
    code = (
        "import importlib.util, json, sys\n"
        "spec = importlib.util.spec_from_file_location('determinism_child', sys.argv[1])\n"
        "mod = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(mod)\n"
        "open(sys.argv[2], 'w').write(json.dumps(mod.all_digests()))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).resolve()), str(out_file)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S,
        check=False)
    assert proc.returncode == 0, f"child PYTHONHASHSEED={hash_seed} failed:\n{proc.stderr}"
    result: dict[str, Any] = json.loads(out_file.read_text())
    return result


@pytest.fixture(scope="module")
def child_digests(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Digests from two fresh interpreters (hash seeds 1 and 2) and one spawn worker."""
    out_dir = tmp_path_factory.mktemp("determinism")
    results = {f"PYTHONHASHSEED={s}": _run_child(s, out_dir) for s in ("1", "2")}
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        results["spawn"] = pool.submit(all_digests).result(timeout=CHILD_TIMEOUT_S)
    return results


def test_children_really_use_different_hash_salts(
    child_digests: dict[str, dict[str, Any]],
) -> None:
    probes = {child_digests[k]["hash_probe"] for k in ("PYTHONHASHSEED=1", "PYTHONHASHSEED=2")}
    assert len(probes) == 2


@pytest.mark.parametrize("env_name", sorted(CASES))
def test_same_seed_same_episodes_across_processes(
    env_name: str, child_digests: dict[str, dict[str, Any]],
) -> None:
    records = episode_records(env_name)
    assert len(records) == N_SEEDS
    assert len(set(records)) >= MIN_DISTINCT[env_name], "seeds barely change the episode"
    parent = digest(records)
    for where, digests in child_digests.items():
        assert digests[env_name] == parent, f"{env_name}: {where} differs from the parent"


@pytest.mark.parametrize("env_name", sorted(CASES))
def test_reused_env_matches_fresh_env(env_name: str) -> None:
    """Nothing leaks from one episode into the next: reusing the instance changes nothing."""
    assert episode_records(env_name) == episode_records(env_name, fresh_env_per_seed=True)
