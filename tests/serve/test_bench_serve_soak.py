"""``turnpool bench serve-soak`` at a tiny size: a real ``turnpool serve --env faulty`` process
and a real load client process on 127.0.0.1, with faults (raise, hang, exit) on 10% of the
steps and reconnect churn; every fault is classified, no session is lost, RSS is sampled."""

from __future__ import annotations

import json
import statistics

import pytest

from turnpool.bench.serve_soak import ACCEPTED, FAULTS, Settings, fitted_growth, render, run

pytestmark = pytest.mark.timeout(120)


@pytest.mark.slow(seconds=24)
def test_serve_soak_classifies_every_fault_and_loses_no_session() -> None:
    s = Settings(sessions=16, think=0.05, seconds=20.0, sample_every=5.0, warmup=5.0,
                 fault_rate=0.1, reconnect_every=5.0, step_timeout=1.0)
    report = run(s)
    json.dumps(report)  # the report is plain JSON

    samples = report["samples"]
    assert [round(x["t_s"]) for x in samples] == [5, 10, 15, 20]
    for x in samples:
        assert x["rss_mb"] > x["main_rss_mb"] > 0  # server + workers, server alone
        assert x["sessions_open"] <= s.sessions and x["steps"] > 0
        assert x["p50_ms"] is not None and x["p50_ms"] <= x["p99_ms"]
    totals = report["totals"]
    assert totals["started"] == s.sessions and totals["ended_unfinished"] == 0
    tail = totals["after_last_sample"]
    assert totals["steps"] == sum(x["steps"] for x in samples) + tail["steps"]
    assert tail["steps"] <= s.sessions  # only the steps in flight at the end
    assert totals["normal_steps"] > 0 and totals["reconnects"] >= 3
    # faults were injected, each kind, and every one got the error its kind calls for
    assert set(totals["faults"]) == set(FAULTS)
    assert report["faults_injected"] == sum(totals["faults"].values()) > 0
    for fault, n in totals["faults"].items():  # each fault answered with a class right for it
        right = {f"{fault}->{c}" for c in ACCEPTED[fault]}
        assert sum(v for k, v in totals["classified"].items() if k in right) == n
    assert not [k for k in totals["classified"] if k.split("->")[1] not in
                ACCEPTED[k.split("->")[0]]]
    assert totals["misclassified"] == 0 and totals["unexpected_errors"] == {}
    assert totals["lost"] == 0 and totals["lost_by"] == {}
    rss = report["rss"]
    assert rss["first_t_s"] == samples[0]["t_s"] and rss["last_mb"] == samples[-1]["rss_mb"]
    assert rss["growth"] == pytest.approx((rss["last_mb"] - rss["first_mb"]) / rss["first_mb"])
    after = [x["rss_mb"] for x in samples if x["t_s"] >= 5.0 - 1e-6]
    w = rss["window"]
    assert 1 <= w <= max(1, len(after) // 2)
    assert rss["start_median_mb"] == statistics.median(after[:w])
    assert rss["end_median_mb"] == statistics.median(after[-w:])
    points = [(x["t_s"], x["rss_mb"]) for x in samples if x["t_s"] >= 5.0 - 1e-6]
    assert rss["trend"] == pytest.approx(fitted_growth(points))
    assert report["checks"]["rss_growth_within_5pct"] == (rss["trend"] <= 0.05)

    assert report["checks"]["complete"] and report["checks"]["no_lost_session"]
    assert report["checks"]["faults_all_classified"]
    assert any("checks:" in str(item) for item in render(report))


def test_fitted_growth_reads_the_trend_through_the_swings() -> None:
    flat = [(t, 100.0 + (20.0 if t % 2 else -20.0)) for t in range(100)]
    assert fitted_growth(flat) == pytest.approx(0.0, abs=0.05)
    rising = [(t, 100.0 + 2.0 * t) for t in range(11)]
    assert fitted_growth(rising) == pytest.approx(0.2)
    assert fitted_growth([(1.0, 5.0)]) is None
