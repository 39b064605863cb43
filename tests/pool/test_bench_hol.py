"""``turnpool bench hol`` measures what one hanging env costs the envs that share its worker;
at a small size here, on real worker processes, it must show the hand-off working: the
innocents on the hung env's worker wait about the hand-off time with it, and the full
``step_timeout`` without it."""

from __future__ import annotations

from typing import Any

import pytest

from turnpool.bench.hol import render, run

pytestmark = pytest.mark.timeout(180)

STEP_TIMEOUT = 3.0  # far above the hand-off (50 ms), so a loaded machine keeps the contrast


def test_bench_hol_shows_the_handoff() -> None:
    seen: list[str] = []

    def progress(what: str, done: Any = None, total: Any = None) -> None:
        seen.append(what)

    report = run(["pool"], sessions=8, pairs=1, warmup=0.3, seconds=2.5,
                 step_timeout=STEP_TIMEOUT, compare_no_handoff=True, progress=progress,
                 slow_factor=100)
    rows = {w["kind"]: w for w in report["windows"]}
    assert set(rows) == {"uniform", "hang", "hang, no hand-off", "1% slow"}
    assert len(seen) == 4
    assert 0 < report["slow_ms"] < 50
    for row in rows.values():
        assert row["innocent_errors"] == 0
        assert row["steps_per_s"] > 0 and row["p99_ms"] is not None
    # with hand-off the worker-mates of the hung env never wait for its deadline ...
    assert rows["hang"]["near_max_ms"] < STEP_TIMEOUT * 1000
    # ... without it they wait for the whole of it (the worker is killed, they are replayed)
    assert rows["hang, no hand-off"]["near_max_ms"] > STEP_TIMEOUT * 1000 * 0.9
    kinds = [(s["through"], s["kind"]) for s in report["summary"]]
    assert kinds == [("pool", "hang"), ("pool", "hang, no hand-off"), ("pool", "1% slow")]
    assert all(s["p99_ratio_median"] > 0 for s in report["summary"])
    assert len(render(report)) == 2


def test_bench_hol_runs_on_the_backend_named() -> None:
    report = run(["pool"], sessions=4, pairs=1, warmup=0.2, seconds=2.0,
                 step_timeout=STEP_TIMEOUT, compare_no_handoff=False,
                 progress=lambda *_: None, backend="process_pool")
    assert report["backend"] == "process_pool"
    hang = next(w for w in report["windows"] if w["kind"] == "hang")
    # hand-off is on by default there too: the hung env's worker-mates never wait its deadline
    assert hang["innocent_errors"] == 0 and hang["near_max_ms"] < STEP_TIMEOUT * 1000
