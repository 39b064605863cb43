"""Same seeds + same actions -> identical results on every backend, worker count and start
method, for every env type (one mixed pool per configuration, 24 envs in 4 groups per type)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.faults import check_fault_isolated, faults_for, faulty_pool
from tests.traces import ENVS, mixed_pool, run_trace
from turnpool.backends import LOCAL_BACKENDS, get_backend
from turnpool.worker.errors import BackendUnavailable

pytestmark = pytest.mark.timeout(240)

START_METHODS = ("spawn", "forkserver", "fork")


def _configs() -> list[tuple[str, int, str | None]]:
    out = []
    for backend in LOCAL_BACKENDS:
        try:
            methods = get_backend(backend).start_methods or (None,)
        except BackendUnavailable:  # collected anyway: the test itself then fails loudly
            methods = (None,)
        for workers in (1, 2, 3):
            for method in methods:
                if method is None or method in START_METHODS:
                    out.append((backend, workers, method))
    return out


@pytest.fixture(scope="module")
def reference(shop_url: str) -> list[Any]:
    with mixed_pool(shop_url, backend="sequential", num_workers=1) as pool:
        trace = run_trace(pool)
    errors = [t for t in trace if t[0] != "reset" and t[-1] is not None]
    assert not errors, errors[:3]  # the reference itself must be clean
    assert len({t[2] for t in trace if t[0] != "reset"}) == len(ENVS)
    return trace


@pytest.mark.parametrize(("backend", "num_workers", "mp_context"), _configs())
def test_every_backend_gives_identical_results(reference: list[Any], shop_url: str,
                                               backend: str, num_workers: int,
                                               mp_context: str | None) -> None:
    extra = {"mp_context": mp_context} if mp_context else {}
    with mixed_pool(shop_url, backend=backend, num_workers=num_workers, **extra) as pool:
        if backend != "auto":  # auto reports the backend it picked
            assert pool.backend_name == backend and pool.num_workers == num_workers
        trace = run_trace(pool)
    assert len(trace) == len(reference)
    for got, want in zip(trace, reference):
        assert got == want, f"first difference: {got!r} != {want!r}"


@pytest.mark.parametrize(("backend", "fault"),
                         [(b, f) for b in LOCAL_BACKENDS for f in faults_for(b)])
def test_faults_are_isolated_alike_on_every_backend(backend: str, fault: str) -> None:
    """Under each fault the faulty env is flagged with its class and every other env's results
    are those of a clean sequential run, whatever the backend (ray: tests/backends/test_ray)."""
    with faulty_pool(backend) as pool:
        check_fault_isolated(pool, fault)
