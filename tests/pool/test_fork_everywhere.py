"""Branching on every built-in env (and a gymnasium env) and every backend: random episodes
branched at random points, forked and restored copies answering exactly as their source
(`tests.traces.branch_trace`), and the same continuations on every backend as in-process.
The Ray backend's run is in `tests/backends/test_ray.py` (one Ray runtime per module) and
across two Ray nodes in `tests/serve/test_ray_nodes.py`."""

from __future__ import annotations

from typing import Any

import pytest

from tests.traces import BRANCH_ENVS, branch_pool, branch_trace

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def reference(shop_url: str) -> list[Any]:
    with branch_pool(shop_url, backend="sequential") as pool:
        trace = branch_trace(pool)
    assert {t[2] for t in trace} == set(BRANCH_ENVS)  # every env type branched and went on
    return trace


@pytest.mark.parametrize("backend, workers", [("thread", 2), ("process", 2), ("process", 3),
                                              ("process_pool", 2), ("joblib", 2)])
def test_branches_continue_as_their_source_on_every_backend(
        reference: list[Any], shop_url: str, backend: str, workers: int) -> None:
    with branch_pool(shop_url, backend=backend, num_workers=workers) as pool:
        assert pool.backend_name == backend
        assert pool.num_workers == workers
        trace = branch_trace(pool)
    assert trace == reference
