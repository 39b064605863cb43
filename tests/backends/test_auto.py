"""auto backend: its choice follows the measured cost, and the pool it runs matches
sequential."""

from __future__ import annotations

from typing import Any

import pytest

from tests.traces import short_trace
from turnpool.backends.auto import EnvProfile, choose
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
