"""Fault-test helpers shared by the pool and backend tests: a pool of ``faulty`` envs, the
check that one fault is isolated to its env, and process-lifetime checks."""

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

from turnpool.envs.synthetic import FaultyEnv, TrivialEnv
from turnpool.pool import EnvPool

STEP_TIMEOUT = 1.5
RESTART_S = 15.0
#: the entry point of `UnpicklableInfoEnv`
UNPICKLABLE_ENV = f"{__name__}:UnpicklableInfoEnv"
FAULTY = 1  # shares its worker with envs 0 and 2 (6 envs on 2 workers)
#: the entry point of `AllFaultsEnv`
ALL_FAULTS_ENV = f"{__name__}:AllFaultsEnv"
#: fault action -> the failure class the pool reports for it
FAULT_CLASSES = {"raise": "env_error", "hang": "timeout", "spin": "timeout",
                 "exit": "worker_lost", "lambda": "unpicklable"}
#: backends whose envs run in the caller's process: an ``os._exit`` ends the caller, and
#: nothing is pickled (so an unpicklable result is no fault there)
IN_PROCESS = ("sequential", "thread", "auto")


class UnpicklableInfoEnv(TrivialEnv):
    """Puts a lambda into info on action "lambda" (a result no pipe can carry)."""

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = super()._step(action)
        if action == "lambda":
            info["callback"] = lambda: None
        return obs, reward, terminated, truncated, info


class AllFaultsEnv(FaultyEnv):
    """`FaultyEnv` plus ``"lambda"`` (a result no pipe can carry) and ``"spin"`` (a hang in a
    pure-Python loop, which an in-process deadline can interrupt on any thread)."""

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if action == "spin":
            n = 0
            while True:
                n += 1
        obs, reward, terminated, truncated, info = super()._step(action)
        if action == "lambda":
            info["callback"] = lambda: None
        return obs, reward, terminated, truncated, info


def faults_for(backend: str) -> list[str]:
    """The faults a backend survives (an env that exits takes an in-process backend's caller
    with it)."""
    if backend.startswith(IN_PROCESS):
        return ["raise", "hang", "spin"]
    return ["raise", "hang", "spin", "exit", "lambda"]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


#: how long a dying process may take to be gone: generous, for a loaded one-core machine (a
#: process that lingers forever still fails; one that goes returns at once)
GONE_S = 30.0


def wait_gone(pids: list[int], within: float) -> list[int]:
    """Poll until every pid is gone or ``within`` seconds pass; the survivors."""
    deadline = time.monotonic() + within
    while True:
        alive = [p for p in pids if not gone(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def mp_helpers() -> set[int]:
    """multiprocessing's own per-interpreter helpers (resource tracker, fork server)."""
    helpers = set()
    for child in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if "resource_tracker" in cmd or "forkserver" in cmd:
            helpers.add(child.pid)
    return helpers


def faulty_pool(backend: str, **kwargs: Any) -> EnvPool:
    """3 groups x 2 `AllFaultsEnv` envs on 2 workers (envs 0-2 and 3-5)."""
    return EnvPool(ALL_FAULTS_ENV, env_num=3, group_n=2, seed=7, backend=backend, num_workers=2,
                   step_timeout=STEP_TIMEOUT, env_kwargs={"episode_len": 1000}, **kwargs)


def check_fault_isolated(pool: EnvPool, fault: str, expected_error: str | None = None
                         ) -> tuple[list[int], list[int]]:
    """One faulty step: only env FAULTY flagged, in time; the others exactly as sequential;
    the next reset brings everything back. Returns the worker pids before and right after
    the faulty step."""
    with faulty_pool("sequential") as reference:
        assert pool.reset(seed=30) == reference.reset(seed=30)
        warmup = [f"w{i}" for i in range(pool.num_envs)]
        assert pool.step(warmup) == reference.step(warmup)  # history the restart replays
        before = pool.worker_pids()
        actions = ["go"] * pool.num_envs
        actions[FAULTY] = fault
        started = time.monotonic()
        obs, rewards, dones, infos = pool.step(actions)
        # bounded: the deadline plus a worker restart (a whole executor's on joblib-loky),
        # with room for a loaded machine; a hang would never return
        assert time.monotonic() - started < STEP_TIMEOUT + RESTART_S
        after = pool.worker_pids()
        ref = reference.step(["go"] * pool.num_envs)
        assert infos[FAULTY]["error"] and dones[FAULTY] and rewards[FAULTY] == 0.0
        if expected_error is not None:
            assert expected_error in infos[FAULTY]["error"]
        if fault in FAULT_CLASSES:  # every fault is classified
            assert infos[FAULTY]["failure"] == FAULT_CLASSES[fault], infos[FAULTY]
            assert infos[FAULTY]["retryable"] == (fault in ("hang", "spin", "exit"))
        for i in range(pool.num_envs):
            if i != FAULTY:  # innocent envs, including the faulty env's worker-mates
                assert (obs[i], rewards[i], dones[i], infos[i]) == (
                    ref[0][i], ref[1][i], ref[2][i], ref[3][i])
        assert pool.reset(seed=31) == reference.reset(seed=31)
        assert pool.step(["fine"] * pool.num_envs) == reference.step(["fine"] * pool.num_envs)
    return before, after


def check_mates_not_held(backend: str, **options: Any) -> None:
    """One worker, four envs, one of them hangs: its mates are answered (as a clean run answers
    them) by an earlier poll than the one that brings the hung env's deadline, which fails it
    alone. Every remote backend hands a stalled env off by default."""
    kwargs: dict[str, Any] = {"env_num": 4, "seed": 3, "env_kwargs": {"episode_len": 100}}
    with EnvPool("faulty", backend=backend, num_workers=1, step_timeout=4.0, **kwargs,
                 **options) as pool, EnvPool("faulty", backend="sequential", **kwargs) as ref:
        assert pool.reset() == ref.reset()
        pool.step_async([0, 1, 2, 3], [["go"], ["hang"], ["go"], ["go"]])
        got: dict[int, tuple[int, Any]] = {}  # env -> (which poll answered it, result)
        for n in range(8):
            got.update((i, (n, r)) for i, r in pool.poll(timeout=20.0))
            if len(got) == 4:
                break
        want = ref.step_turns([["go"]] * 4)
    assert sorted(got) == [0, 1, 2, 3]
    for i in (0, 2, 3):
        assert got[i][0] < got[1][0] and got[i][1] == want[i]
    assert got[1][1].failure == "timeout"


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


def kill_parent_and_check(tmp_path: Path, options: dict[str, Any],
                          exact_workers: bool = True) -> None:
    """SIGKILL a process that holds a pool with a worker stuck in env code: every worker must
    be gone soon after (``exact_workers=False`` allows a standby worker in the pids)."""
    script = tmp_path / "parent.py"
    script.write_text(_PARENT)
    parent = subprocess.Popen([sys.executable, str(script), json.dumps(options)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              cwd=os.getcwd())
    try:
        assert parent.stdout is not None
        pids = json.loads(parent.stdout.readline())
        assert len(pids) == 2 if exact_workers else len(pids) >= 2
        assert parent.pid not in pids and not any(gone(p) for p in pids)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        assert wait_gone(pids, GONE_S) == []
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
