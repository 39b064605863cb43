"""auto backend: its choice follows the measured cost, and the pool it runs matches
sequential."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.traces import short_trace
from turnpool.backends.auto import EnvProfile, choose
from turnpool.backends.process import STANDBY_NICE, unguarded_main_call
from turnpool.pool import EnvPool

pytestmark = pytest.mark.timeout(120)


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
        want = short_trace(ref, turns=2)
    with EnvPool(env_type, env_num=4, group_n=2, seed=1, env_kwargs=kwargs,
                 backend="auto") as pool:
        assert pool.backend_name == picked
        assert short_trace(pool, turns=2) == want


# ------------------------------------------------------------ scripts without a main guard
_UNGUARDED = """
import logging, sys, turnpool
logging.basicConfig(level=logging.WARNING)
pool = turnpool.EnvPool("cpu", env_num=4, env_kwargs={"work_iters": 20000},
                        num_workers=2, {backend})
pool.reset()
print("BACKEND", pool.backend_name)
pool.close()
"""
_GUARDED = """
import turnpool

def main():
    with turnpool.EnvPool("cpu", env_num=4, env_kwargs={"work_iters": 20000},
                          num_workers=2, {backend}) as pool:
        pool.reset()
        print("BACKEND", pool.backend_name)

if __name__ == "__main__":
    main()
"""


def _run_script(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(source)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env=env)


@pytest.mark.parametrize(("template", "backend", "picked", "warns"), [
    # the default never spawns here: auto measures and stays in-process (which one of
    # sequential / thread depends on the machine's load, so either is accepted)
    (_UNGUARDED, "", ("auto->sequential", "auto->thread"), False),
    # asked for: one warning, no traceback
    (_UNGUARDED, 'backend="process", fallback=True', ("sequential",), True),
    (_GUARDED, 'backend="process"', ("process",), False),
])
def test_scripts_without_a_main_guard_never_spawn(tmp_path: Path, template: str,
                                                  backend: str, picked: tuple[str, ...],
                                                  warns: bool) -> None:
    proc = _run_script(tmp_path, template.replace("{backend}", backend))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("BACKEND ")
    assert proc.stdout.split()[1] in picked
    assert "Traceback" not in proc.stderr and "RuntimeError" not in proc.stderr
    assert ("re-run the main script" in proc.stderr) == warns


def test_a_named_backend_that_cannot_start_is_an_error_naming_the_fix(tmp_path: Path) -> None:
    """Without ``fallback=True`` a backend the user named is never replaced by another."""
    proc = _run_script(tmp_path, _UNGUARDED.replace("{backend}", 'backend="process"'))
    assert proc.returncode != 0 and "BACKEND" not in proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("turnpool.worker.errors.BackendUnavailable: backend 'process'")
    assert 'if __name__ == "__main__":' in last


_PROBE = """
from turnpool.backends.process import unguarded_main_call

def where():
    return unguarded_main_call()

print("top", where())

def main():
    print("guarded", where())

if __name__ == "__main__":
    main()
    print("guard body", where())
"""


def test_unguarded_main_call_tells_guarded_from_top_level_code(tmp_path: Path) -> None:
    proc = _run_script(tmp_path, _PROBE)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:3] == ["top True", "guarded False", "guard body False"]
    assert unguarded_main_call() is False  # pytest's own entry point is guarded


def test_auto_leaves_processes_out_when_told() -> None:
    heavy = EnvProfile(step_wall_s=1e-3, step_cpu_s=1e-3, reset_wall_s=1e-5, steps=20)
    assert choose(heavy, 8, cores=2, allow_process=False)[0] == "sequential"


# ------------------------------------------------------------------- the standby worker
def test_standby_waits_at_the_lowest_priority_and_is_promoted_at_ours() -> None:
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    with EnvPool("trivial", env_num=2, seed=1, backend="process", num_workers=2,
                 mp_context="spawn") as pool:
        pool.reset()
        live, standby = pool.worker_pids()[:2], pool.worker_pids()[2]
        assert os.getpriority(os.PRIO_PROCESS, standby) == STANDBY_NICE
        assert {os.getpriority(os.PRIO_PROCESS, p) for p in live} == {mine}
        os.kill(live[0], signal.SIGKILL)
        _, _, _, infos = pool.step(["a", "b"])
        # killed while idle: no env is blamed, the request ran again on the replacement
        assert all("error" not in info for info in infos)
        pids = pool.worker_pids()
        assert pids[0] == standby  # the standby took the dead worker's place ...
        assert os.getpriority(os.PRIO_PROCESS, standby) == mine  # ... at our priority
        assert os.getpriority(os.PRIO_PROCESS, pids[2]) == STANDBY_NICE  # a new standby


def test_a_worker_count_does_not_send_microsecond_envs_to_processes() -> None:
    tiny = EnvProfile(step_wall_s=2e-6, step_cpu_s=2e-6, reset_wall_s=1e-5, steps=20)
    heavy = EnvProfile(step_wall_s=1e-3, step_cpu_s=1e-3, reset_wall_s=1e-5, steps=20)
    for cores in (2, 16):
        for workers in (2, 4, 64):
            assert choose(tiny, 4096, cores=cores, num_workers=workers)[0] == "sequential"
    assert choose(heavy, 64, cores=2, num_workers=8)[0] == "process"
    # eight workers on two cores run two at a time: no faster than two workers
    assert choose(heavy, 64, cores=2, num_workers=8)[1] >= choose(heavy, 64, cores=2,
                                                                   num_workers=2)[1]


def test_sokoban_under_auto_with_four_workers_stays_in_process() -> None:
    with EnvPool("sokoban", env_num=128, group_n=16, backend="auto",
                 num_workers=4) as pool:
        assert pool.backend_name == "auto->sequential"
