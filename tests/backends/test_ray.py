"""The ray backend on a real local Ray cluster bound to 127.0.0.1 (one runtime for the module):
identical results on every env type and actor count, isolated faults (exit, hang, raise),
no actor left after close, and a second driver joining the cluster through ``ray_address``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import pytest  # noqa: E402
import ray  # noqa: E402

from tests.faults import (
    GONE_S,
    # noqa: E402
    check_fault_isolated,
    check_mates_not_held,
    faults_for,
    faulty_pool,
    wait_gone,
)
from tests.ray_cluster import local_ray  # noqa: E402
from tests.traces import (  # noqa: E402
    DialEnv,
    branch_pool,
    branch_trace,
    calls_trace,
    mixed_pool,
    run_trace,
)
from turnpool.pool import EnvPool  # noqa: E402
from turnpool.pool.api import EnvConstructionError  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]


ray_runtime = pytest.fixture(scope="module", autouse=True)(local_ray)


def test_the_cluster_listens_on_loopback_only() -> None:
    assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
    assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:")


@pytest.fixture(scope="module")
def reference(shop_url: str) -> list[Any]:
    with mixed_pool(shop_url, backend="sequential", num_workers=1) as pool:
        return run_trace(pool)


@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_every_env_type_identical_to_sequential(reference: list[Any], shop_url: str,
                                                num_workers: int) -> None:
    with mixed_pool(shop_url, backend="ray", num_workers=num_workers) as pool:
        assert pool.backend_name == "ray" and pool.num_workers == num_workers
        pids = pool.worker_pids()
        assert len(pids) == num_workers and os.getpid() not in pids
        trace = run_trace(pool)
    assert wait_gone(pids, 0.0) == []  # close() returns after the actors are gone
    assert len(trace) == len(reference)
    for got, want in zip(trace, reference):
        assert got == want, f"first difference: {got!r} != {want!r}"


def test_branches_on_ray_continue_as_in_process(shop_url: str) -> None:
    """Forks and restores between actors continue as their source, and as in-process."""
    with branch_pool(shop_url, backend="sequential") as pool:
        want = branch_trace(pool)
    with branch_pool(shop_url, backend="ray", num_workers=3) as pool:
        assert pool.backend_name == "ray"
        assert branch_trace(pool) == want


@pytest.fixture(scope="module")
def pool() -> Iterator[EnvPool]:
    p = faulty_pool("ray", handoff_after=None)  # hangs take the kill-and-replay path
    assert p.backend_name == "ray"
    yield p
    pids = p.worker_pids()
    p.close()
    p.close()  # idempotent
    assert wait_gone(pids, 0.0) == []


@pytest.mark.parametrize("fault", faults_for("ray"))
def test_only_the_faulty_env_is_flagged(pool: EnvPool, fault: str) -> None:
    expected = {"raise": "RuntimeError", "exit": "ray actor died", "hang": "step timeout",
                "spin": "step timeout", "lambda": "unpicklable result"}[fault]
    pids, now = check_fault_isolated(pool, fault, expected)
    assert now[1] == pids[1]  # the other actor was untouched
    if fault not in ("raise", "lambda"):  # the actor was replaced and its process is gone
        assert now[0] != pids[0] and wait_gone([pids[0]], GONE_S) == []


def test_a_hung_env_holds_back_only_itself() -> None:
    """Actors run the hand-off loop too, on by default."""
    check_mates_not_held("ray")


def test_envs_an_actor_cannot_build_or_import_fail_the_constructor(tmp_path: Any) -> None:
    """Construction errors raise on Ray too, with the cause from the actor (no colour codes),
    including a module the driver has but the actors cannot import."""
    with pytest.raises(EnvConstructionError) as info:
        EnvPool("trivial", env_num=1, group_n=2, backend="ray", num_workers=2, tag="Echo",
                env_kwargs={"episode_len": "many"})
    assert "tag 'Echo'" in str(info.value) and "invalid literal" in str(info.value)
    assert "\x1b" not in str(info.value)
    (tmp_path / "driver_only_envs.py").write_text(
        "from turnpool.envs.synthetic import TrivialEnv\n\nclass Mine(TrivialEnv):\n    pass\n")
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(EnvConstructionError, match="No module named 'driver_only_envs'"):
            EnvPool("driver_only_envs:Mine", env_num=1, group_n=2, backend="ray",
                    num_workers=1)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("driver_only_envs", None)


def test_soak_on_ray() -> None:
    from turnpool.bench.soak import FAULTS, Settings, run_backend

    # step_timeout 2 s, not the soak's 0.5: with every process on one loaded core an actor
    # can be off the CPU for half a second inside a ``raise`` step, and the pool then rightly
    # calls it a timeout, which the soak counts as misclassified (seen under `taskset -c 0`)
    result = run_backend("ray", Settings(steps=600, fault_rate=0.04, step_timeout=2.0))
    assert result.ok, str(asdict(result))
    assert result.transitions_returned == result.transitions_requested >= 600
    assert result.innocent_mismatches == 0 and result.misclassified == 0 and result.hangs == 0
    assert set(result.faults) <= set(FAULTS) and sum(result.faults.values()) > 5


_DRIVER = textwrap.dedent("""
    import json, sys
    import ray
    from turnpool.pool import EnvPool

    if __name__ == "__main__":
        with EnvPool("frozen_lake", env_num=2, group_n=2, seed=3, backend="ray",
                     num_workers=2, ray_address=sys.argv[1]) as pool:
            result = [pool.reset(), pool.step([1, 2, 3, 4]), pool.backend_name]
            result.append(ray.get_runtime_context().gcs_address)
        print(json.dumps(result), flush=True)
""")


def test_ray_address_joins_the_running_cluster(tmp_path: Any) -> None:
    address = ray.get_runtime_context().gcs_address
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, str(script), address], capture_output=True,
                          text=True, timeout=90, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    reset, step, name, joined = json.loads(proc.stdout.strip().splitlines()[-1])
    assert name == "ray" and joined == address
    with EnvPool("frozen_lake", env_num=2, group_n=2, seed=3, backend="sequential") as ref:
        want = [ref.reset(), ref.step([1, 2, 3, 4])]
    assert [reset, step] == json.loads(json.dumps(want))


def test_calls_into_envs_answer_on_ray_as_in_process() -> None:
    with EnvPool(DialEnv, env_num=3, backend="sequential") as pool:
        want = calls_trace(pool)
    with EnvPool(DialEnv, env_num=3, backend="ray", num_workers=2) as pool:
        assert pool.backend_name == "ray"
        assert calls_trace(pool) == want
