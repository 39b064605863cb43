"""process_pool, joblib and auto backends with real processes: exact results, seed 001/002
options, faults isolated, nothing left behind; plus the pool benchmark's smoke run.

(Their equivalence over every env type x worker count x start method is in
``test_pool_equivalence.py``; the fault matrix for the process backend in
``test_pool_faults.py``.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from click.testing import CliRunner

from turnpool.backends.auto import EnvProfile, choose
from turnpool.pool.protocol import EnvBuild
from turnpool.backends.joblib import JoblibBackend
from turnpool.backends.process_pool import ProcessPoolBackend
from turnpool.envs.synthetic import TrivialEnv
from turnpool.pool import EnvGroupSpec, EnvPool

pytestmark = pytest.mark.timeout(120)

STEP_TIMEOUT = 1.5
FAULTY = 1  # shares its worker with env 0 and 2 (6 envs on 2 workers)


class PidEnv(TrivialEnv):
    """Told ``"where"``, reports the process it runs in, so a test can see where it lives."""

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = super()._step(action)
        if action == "where":
            info = {**info, "pid": os.getpid()}
        return obs, reward, terminated, truncated, info


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_gone(pids: list[int], within: float) -> list[int]:
    """Poll until every pid is gone or ``within`` seconds pass; the survivors."""
    deadline = time.monotonic() + within
    while True:
        alive = [p for p in pids if not _gone(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def _trace(pool: EnvPool, turns: int = 4) -> list[Any]:
    out: list[Any] = [pool.reset(seed=11)]
    for t in range(turns):
        out.append(pool.step_turns([[f"a{t}", "b"][: 1 + (i + t) % 2]
                                    for i in range(pool.num_envs)]))
    out.append(pool.reset())
    return out


def _faulty_pool(backend: str, **kwargs: Any) -> EnvPool:
    return EnvPool("faulty", env_num=3, group_n=2, seed=7, backend=backend, num_workers=2,
                   step_timeout=STEP_TIMEOUT, env_kwargs={"episode_len": 1000}, **kwargs)


def _check_fault_isolated(pool: EnvPool, fault: str) -> None:
    """One faulty step: only env FAULTY flagged, in time; the others exactly as sequential;
    the next reset brings everything back."""
    with _faulty_pool("sequential") as reference:
        assert pool.reset(seed=30) == reference.reset(seed=30)
        warmup = [f"w{i}" for i in range(pool.num_envs)]
        assert pool.step(warmup) == reference.step(warmup)  # history the restart replays
        actions = ["go"] * pool.num_envs
        actions[FAULTY] = fault
        started = time.monotonic()
        obs, rewards, dones, infos = pool.step(actions)
        assert time.monotonic() - started < STEP_TIMEOUT + 1.0
        ref = reference.step(["go"] * pool.num_envs)
        assert infos[FAULTY]["error"] and dones[FAULTY] and rewards[FAULTY] == 0.0
        for i in range(pool.num_envs):
            if i != FAULTY:
                assert (obs[i], rewards[i], dones[i], infos[i]) == (
                    ref[0][i], ref[1][i], ref[2][i], ref[3][i])
        assert pool.reset(seed=31) == reference.reset(seed=31)
        assert pool.step(["fine"] * pool.num_envs) == reference.step(["fine"] * pool.num_envs)


_PARENT = textwrap.dedent("""
    import json, sys
    from turnpool.pool import EnvPool

    if __name__ == "__main__":
        options = json.loads(sys.argv[1])
        pool = EnvPool("faulty", env_num=2, group_n=2, num_workers=2, step_timeout=600,
                       **options)
        pool.reset()
        pool.step_async([0], [["hang"]])  # worker 0 is stuck inside env code
        print(json.dumps(pool.worker_pids()), flush=True)
        sys.stdin.read()
""")


def _kill_parent_and_check(tmp_path: Path, options: dict[str, Any]) -> None:
    script = tmp_path / "parent.py"
    script.write_text(_PARENT)
    parent = subprocess.Popen([sys.executable, str(script), json.dumps(options)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pids = json.loads(parent.stdout.readline())
        assert len(pids) == 2 and parent.pid not in pids and not any(_gone(p) for p in pids)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        assert _wait_gone(pids, 5.0) == []
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)


# ------------------------------------------------------------------------- process_pool
def test_process_pool_seed_001_defaults_and_max_workers() -> None:
    builds = [EnvBuild(i, "turnpool.envs.synthetic:TrivialEnv") for i in range(100)]
    assert ProcessPoolBackend(builds).num_workers == min(8, os.cpu_count() or 1)
    assert ProcessPoolBackend(builds[:1]).num_workers == 1
    assert ProcessPoolBackend(builds, max_workers=3).num_workers == 3
    assert ProcessPoolBackend(builds, 5, max_workers=3).num_workers == 5  # explicit wins
    with EnvPool("trivial", env_num=4, backend="process_pool", max_workers=1,
                 mp_context="fork") as pool:
        assert pool.backend_name == "process_pool" and pool.num_workers == 1


def test_process_pool_sequential_env_types_stay_in_the_caller() -> None:
    pid_env = f"{__name__}:PidEnv"
    specs = [EnvGroupSpec("web", "trivial", 2), EnvGroupSpec("cpu", pid_env, 2)]
    kwargs: dict[str, Any] = {"group_n": 2, "seed": 5, "num_workers": 2}
    with EnvPool.from_specs(specs, backend="sequential", **kwargs) as reference:
        want = _trace(reference)
    with EnvPool.from_specs(specs, backend="process_pool", mp_context="fork",
                            sequential_env_types=["trivial"], **kwargs) as pool:
        assert pool.backend_name == "process_pool"
        assert len(pool.worker_pids()) == 2  # the trivial envs got no process
        assert _trace(pool) == want
        _, _, _, infos = pool.step(["where"] * pool.num_envs)
    caller = os.getpid()
    assert all(i["pid"] != caller for i, tag in zip(infos, pool.tags) if tag == "cpu")
    assert len({i["pid"] for i, tag in zip(infos, pool.tags) if tag == "cpu"}) == 2


@pytest.fixture(scope="module")
def process_pool_faulty() -> Any:
    pool = _faulty_pool("process_pool", mp_context="forkserver")
    assert pool.backend_name == "process_pool"
    yield pool
    pids = pool.worker_pids()
    pool.close()
    assert _wait_gone(pids, 0.0) == []  # close() returns after its workers are gone


@pytest.mark.parametrize("fault", ["raise", "exit", "hang"])
def test_process_pool_fault_is_isolated(process_pool_faulty: EnvPool, fault: str) -> None:
    pids = process_pool_faulty.worker_pids()
    _check_fault_isolated(process_pool_faulty, fault)
    now = process_pool_faulty.worker_pids()
    assert now[1] == pids[1]  # the other worker was untouched
    if fault != "raise":
        assert now[0] != pids[0] and _wait_gone([pids[0]], 5.0) == []


def test_process_pool_workers_die_with_a_killed_parent(tmp_path: Path) -> None:
    _kill_parent_and_check(tmp_path, {"backend": "process_pool", "mp_context": "forkserver"})


# ------------------------------------------------------------------------------ joblib
def test_joblib_seed_002_n_jobs() -> None:
    builds = [EnvBuild(i, "turnpool.envs.synthetic:TrivialEnv") for i in range(64)]
    import joblib

    assert JoblibBackend(builds, n_jobs=-1).num_workers == joblib.cpu_count()
    assert JoblibBackend(builds, n_jobs=3).num_workers == 3
    assert JoblibBackend(builds[:2], n_jobs=8).num_workers == 2
    with pytest.raises(ValueError, match="joblib_backend"):
        JoblibBackend(builds, joblib_backend="dask")


def test_joblib_start_failure_leaves_nothing_behind() -> None:
    from turnpool.pool.protocol import BackendUnavailable

    def progress_files() -> set[str]:
        return {f for f in os.listdir("/dev/shm") if f.startswith("turnpool-progress-")}

    before = progress_files()
    builds = [EnvBuild(i, "turnpool.envs.synthetic:TrivialEnv") for i in range(4)]
    backend = JoblibBackend(builds, 2, joblib_backend="threading")
    with pytest.raises(BackendUnavailable, match="did not"):
        backend.start(timeout=0.0)  # no worker can connect in no time
    assert progress_files() - before == set()


@pytest.mark.parametrize("flavour", ["multiprocessing", "threading"])
def test_joblib_flavours_match_sequential(flavour: str) -> None:
    with EnvPool("frozen_lake", env_num=3, group_n=2, seed=9, backend="sequential") as ref:
        want = _trace(ref)
    with EnvPool("frozen_lake", env_num=3, group_n=2, seed=9, backend="joblib",
                 joblib_backend=flavour, num_workers=3) as pool:
        assert pool.backend_name == "joblib" and pool.num_workers == 3
        assert _trace(pool) == want


@pytest.mark.parametrize(("flavour", "fault"), [("loky", "hang"), ("loky", "raise"),
                                                ("multiprocessing", "exit"),
                                                ("threading", "hang")])
def test_joblib_fault_is_isolated(flavour: str, fault: str) -> None:
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    with _faulty_pool("joblib", joblib_backend=flavour) as pool:
        assert pool.backend_name == "joblib"
        pids = pool.worker_pids()
        _check_fault_isolated(pool, fault)
        if flavour != "threading":
            # A hung loky task is interrupted, not killed: loky would take every worker down.
            assert pool.worker_pids()[1] == pids[1]
        pids += pool.worker_pids()
    assert _wait_gone(pids, 0.0) == []
    if flavour == "loky":
        after = {c.pid for c in psutil.Process().children(recursive=True)}
        helpers = {c.pid for c in psutil.Process().children(recursive=True)
                   if "resource_tracker" in " ".join(c.cmdline())}
        assert after - before - helpers == set()  # loky's idle workers were shut down too


def test_joblib_workers_die_with_a_killed_parent(tmp_path: Path) -> None:
    _kill_parent_and_check(tmp_path, {"backend": "joblib", "joblib_backend": "loky"})


# -------------------------------------------------------------------------------- auto
def test_auto_choice_follows_measured_cost() -> None:
    tiny = EnvProfile(step_wall_s=2e-6, step_cpu_s=2e-6, reset_wall_s=1e-5, steps=20)
    heavy = EnvProfile(step_wall_s=1e-3, step_cpu_s=1e-3, reset_wall_s=1e-5, steps=20)
    waiting = EnvProfile(step_wall_s=1e-3, step_cpu_s=2e-5, reset_wall_s=1e-5, steps=20)
    assert choose(tiny, 256, cores=2)[0] == "sequential"
    assert choose(heavy, 8, cores=2)[0] == "process"
    assert choose(heavy, 8, cores=1)[0] == "sequential"
    assert choose(heavy, 1, cores=2)[0] == "sequential"
    assert choose(waiting, 64, cores=2)[0] == "thread"
    assert choose(waiting, 64, cores=2, num_workers=1)[0] == "sequential"


@pytest.mark.parametrize(("env_type", "kwargs", "picked"), [
    ("trivial", {}, "auto->sequential"),
    ("sleep", {"sleep_ms": 5.0}, "auto->thread"),
])
def test_auto_reports_its_choice_and_matches_sequential(env_type: str, kwargs: dict[str, Any],
                                                        picked: str) -> None:
    with EnvPool(env_type, env_num=4, group_n=2, seed=1, env_kwargs=kwargs,
                 backend="sequential") as ref:
        want = _trace(ref, turns=2)
    with EnvPool(env_type, env_num=4, group_n=2, seed=1, env_kwargs=kwargs,
                 backend="auto") as pool:
        assert pool.backend_name == picked
        assert _trace(pool, turns=2) == want


# -------------------------------------------------------------------------- benchmark
def test_bench_pool_quick_writes_json_and_png(tmp_path: Path) -> None:
    from turnpool.bench.pool import command

    out, png = tmp_path / "pool.json", tmp_path / "pool.png"
    result = CliRunner().invoke(command, [
        "--quick", "--backends", "sequential,thread,process_pool,auto", "--envs",
        "trivial,sleep", "--gym-max-n", "8", "--json", str(out), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    rows = {(r["env"], r["backend"], r["n"]): r for r in report["rows"]}
    for env in ("trivial", "sleep"):
        for backend in ("sequential", "thread", "process_pool", "auto", "gym_async"):
            row = rows[(env, backend, 8)]
            assert row["error"] is None and row["batch_s"] > 0 and row["steps"] >= 2
    assert rows[("trivial", "auto", 8)]["active_backend"] == "auto->sequential"
    assert report["summary"]["speedup"]["sleep"]["thread"]["8"] > 0
    assert {g["goal"] for g in report["summary"]["goals"]} >= {
        "auto / best backend, worst env and N"}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "gymnasium AsyncVectorEnv" in result.output
