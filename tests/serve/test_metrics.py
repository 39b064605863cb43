"""``/metrics``: Prometheus's text format, parsed by prometheus-client's own parser; the
numbers follow what the server did."""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.serve.conftest import client
from turnpool.serve import ServeSettings, TurnpoolServer


def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    reply = httpx.get(url + "/metrics", timeout=30)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(reply.text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_metrics_follow_steps_sessions_and_failures() -> None:
    settings = ServeSettings(env="faulty", max_sessions=4, backend="sequential", num_workers=2)
    with TurnpoolServer(settings) as srv:
        with client(srv.url) as a, client(srv.url) as b:
            a.reset(seed=1)
            b.reset(seed=2)
            for _ in range(5):
                a.step({"action": "x"})
            failed: Any = None
            try:
                b.step({"action": "raise"})
            except RuntimeError as exc:
                failed = exc
            assert failed is not None
            m = _scrape(srv.url)
            assert m[("turnpool_sessions", (("kind", "ws"),))] == 2
            assert m[("turnpool_slots_leased", ())] == 2
            workers = [v for (name, _), v in m.items() if name == "turnpool_worker_sessions"]
            assert sorted(workers) == [1, 1]  # sessions are spread over the workers
            load = {labels: v for (name, labels), v in m.items()
                    if name == "turnpool_worker_load"}
            assert len(load) == 2 and all(v > 0 for v in load.values())
            status = httpx.get(srv.url + "/api/status", timeout=30).json()
            assert [w["sessions"] for w in status["workers"]] == [1, 1]
            # the latency since the last status call (these 6 steps), from the histogram
            assert 0 < status["latency_p50_ms"] <= status["latency_p99_ms"] <= 60_000
            again = httpx.get(srv.url + "/api/status", timeout=30).json()
            assert again["latency_p50_ms"] is None  # no step since
        m = _scrape(srv.url)
    assert m[("turnpool_step_latency_seconds_count", ())] == 6
    assert 0 < m[("turnpool_step_latency_seconds_sum", ())] < 60
    assert m[("turnpool_steps_total", ())] == 6
    assert m[("turnpool_resets_total", ())] == 2
    assert m[("turnpool_failures_total", (("failure", "env_error"),))] == 1
    assert m[("turnpool_failures_total", (("failure", "timeout"),))] == 0
    assert m[("turnpool_sessions", (("kind", "ws"),))] == 0
