"""Calls into the envs where they live (`EnvPool.call`, `EnvPool.set_attr`): the same answers
and the same errors on every backend, values and arguments that must pickle everywhere, and a
call that hangs held to ``step_timeout`` like a step. Ray's run is in
`tests/backends/test_ray.py`."""

from __future__ import annotations

from typing import Any

import pytest

from tests.traces import DialEnv, calls_trace
from turnpool.pool import EnvPool

pytestmark = pytest.mark.timeout(240)

BACKENDS = [("sequential", 1), ("thread", 2), ("process", 2), ("process_pool", 2),
            ("joblib", 2)]


@pytest.fixture(scope="module")
def reference() -> list[Any]:
    with EnvPool(DialEnv, env_num=3, backend="sequential") as pool:
        return calls_trace(pool)


@pytest.mark.parametrize(("backend", "workers"), BACKENDS)
def test_calls_answer_the_same_on_every_backend(reference: list[Any], backend: str,
                                                 workers: int) -> None:
    with EnvPool(DialEnv, env_num=3, backend=backend, num_workers=workers) as pool:
        assert pool.backend_name == backend
        assert calls_trace(pool) == reference


@pytest.mark.parametrize("backend", ["sequential", "thread", "process"])
def test_a_call_that_hangs_times_out_like_a_step_and_its_env_is_reset(backend: str) -> None:
    with EnvPool(DialEnv, env_num=2, backend=backend, num_workers=1,
                 step_timeout=1.0) as pool:
        first = pool.reset(seed=3)[0]
        mate = pool.step(["a", "b"])[0][1]
        with pytest.raises(TimeoutError, match="env 0: _step: .*must be reset"):
            pool.call("_step", ("hang",), env_ids=[0])
        assert pool.reset(seed=3, env_ids=[0])[0] == first[:1]
        # its mate goes on where it was (restored by replay where the worker was replaced:
        # what calls did to it is not replayed, module doc of `turnpool.pool.calls`)
        assert pool.call("render", ("text",), env_ids=[1]) == [mate]
