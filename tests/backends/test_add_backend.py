"""Adding a backend is one file + one line in `turnpool.backends.BACKENDS`: a backend defined in
``tests/backends/executor_backend.py`` and registered here runs every env type with results
identical to the sequential backend, through the public `EnvPool` API."""

from __future__ import annotations

import pytest

from tests.traces import mixed_pool, run_trace, short_trace
from turnpool.backends import BACKENDS
from turnpool.pool import EnvPool

pytestmark = pytest.mark.timeout(120)

ENTRY = "tests.backends.executor_backend:ExecutorBackend"


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(BACKENDS, "executor", ENTRY)  # the one line
    return "executor"


def test_a_registered_backend_matches_sequential(registered: str, shop_url: str) -> None:
    with mixed_pool(shop_url, backend="sequential", num_workers=1) as reference:
        want = run_trace(reference)
    with mixed_pool(shop_url, backend=registered, num_workers=3) as pool:
        assert pool.backend_name == "executor" and pool.num_workers == 3
        got = run_trace(pool)
    assert got == want


def test_a_registered_backend_runs_async_turns(registered: str) -> None:
    with EnvPool("frozen_lake", env_num=3, group_n=2, seed=9, backend="sequential") as ref, \
            EnvPool("frozen_lake", env_num=3, group_n=2, seed=9, backend=registered,
                    num_workers=2) as pool:
        assert short_trace(pool) == short_trace(ref)
        pool.reset(seed=3)
        pool.step_async([0, 4], [["Left"], ["Down", "Up"]])
        got: dict[int, object] = {}
        while len(got) < 2:
            got.update(pool.poll(timeout=10.0))
        ref.reset(seed=3)
        assert [got[0], got[4]] == ref.step_turns([["Left"], ["Down", "Up"]], env_ids=[0, 4])


def test_an_unregistered_name_is_refused_with_the_known_names() -> None:
    with pytest.raises(ValueError, match="sequential"):
        EnvPool("trivial", backend="executor")
