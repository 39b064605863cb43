"""The status page's step latency quantiles and failures by class: computed from the raw
counts (one way for one server and for the merge of several fronts), served by a real server
in ``/api/status``, and shown on the page in headless Chromium."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.envs.test_webshop_browser import browser  # noqa: F401 - the shared fixture
from tests.serve.conftest import client
from turnpool.serve import ServeSettings, TurnpoolServer
from turnpool.serve.fronts.merge import merge_status
from turnpool.serve.status import BUCKETS, derived, failure_classes, quantiles
from turnpool.worker.failures import FAILURE_CLASSES

pytestmark = pytest.mark.timeout(120)


def _cumulative(per_bucket: dict[float, int]) -> list[float]:
    """Cumulative counts over `BUCKETS` (+Inf last) of steps put in the named buckets."""
    out, n = [], 0
    for bound in [*BUCKETS, float("inf")]:
        n += per_bucket.get(bound, 0)
        out.append(float(n))
    return out


def test_quantiles_are_the_bucket_bounds_they_fall_in() -> None:
    counts = _cumulative({0.001: 900, 0.01: 90, 0.1: 9, 1.0: 1})
    assert quantiles(counts, (0.5, 0.9, 0.99, 0.999, 1.0)) == {
        "p50_ms": 1.0, "p90_ms": 1.0, "p99_ms": 10.0, "p99.9_ms": 100.0, "p100_ms": 1000.0}
    assert quantiles(_cumulative({float("inf"): 1}))["p50_ms"] is None  # past 60 s
    assert quantiles([0.0] * 17) == {"p50_ms": None, "p99_ms": None}


def test_every_failure_class_has_a_row_most_frequent_first() -> None:
    recent = [{"time": 1.0, "failure": "timeout", "error": "old"},
              {"time": 2.0, "failure": "env_error", "error": "boom"},
              {"time": 3.0, "failure": "timeout", "error": "new"}]
    rows = failure_classes({"timeout": 2, "env_error": 6}, recent, steps=4000)
    assert [r["failure"] for r in rows][:2] == ["env_error", "timeout"]
    assert {r["failure"] for r in rows} == set(FAILURE_CLASSES)
    by = {r["failure"]: r for r in rows}
    assert by["timeout"]["last_error"] == "new" and by["timeout"]["retryable"]
    assert by["env_error"]["share"] == 0.75 and by["env_error"]["per_1k_steps"] == 1.5
    assert by["worker_lost"]["count"] == 0 and by["worker_lost"]["last_error"] is None
    assert failure_classes({}, [], steps=0)[0]["per_1k_steps"] is None


def test_several_fronts_derive_from_their_summed_counts() -> None:
    def part(fast: int, slow: int, failures: dict[str, int]) -> dict[str, Any]:
        recent = _cumulative({0.001: fast})
        total = _cumulative({0.001: fast, 1.0: slow})
        return derived({"latency_buckets": recent, "latency_total_buckets": total,
                        "failures": failures, "recent_failures": [], "steps_total": fast + slow})

    merged = merge_status({0: part(10, 0, {"timeout": 1}), 1: part(0, 90, {"timeout": 2})}, 2)
    since = merged["latency_quantiles"]["since_start"]
    assert since["steps"] == 100 and since["p50_ms"] == 1000.0  # front 1's slow steps
    assert merged["latency_quantiles"]["recent"]["steps"] == 10
    assert {r["failure"]: r["count"] for r in merged["failure_classes"]}["timeout"] == 3


def _status(url: str) -> dict[str, Any]:
    out: dict[str, Any] = httpx.get(url + "/api/status", timeout=30).json()
    return out


def test_a_server_reports_quantiles_and_failure_classes(browser: Any) -> None:  # noqa: F811
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def rows(css: str) -> list[list[str]]:
        return [[c.text for c in r.find_elements(By.TAG_NAME, "td")]
                for r in browser.find_elements(By.CSS_SELECTOR, css)]

    def until(check: Any) -> Any:
        return WebDriverWait(browser, 30, poll_frequency=0.2,
                             ignored_exceptions=(StaleElementReferenceException,)
                             ).until(lambda _: check())

    settings = ServeSettings(env="faulty", max_sessions=2, backend="sequential")
    with TurnpoolServer(settings) as server, client(server.url) as env:
        _status(server.url)  # the recent window starts here
        env.reset(seed=1)
        for _ in range(4):
            env.step({"action": "go"})
        with pytest.raises(RuntimeError):
            env.step({"action": "raise"})
        s = _status(server.url)
        q = s["latency_quantiles"]
        assert q["recent"]["steps"] == q["since_start"]["steps"] == 5
        assert 0 < q["recent"]["p50_ms"] <= q["recent"]["p90_ms"] <= q["recent"]["p99.9_ms"]
        again = _status(server.url)["latency_quantiles"]
        assert again["recent"] == {"p50_ms": None, "p90_ms": None, "p99_ms": None,
                                   "p99.9_ms": None, "steps": 0}
        assert again["since_start"] == q["since_start"]
        [env_error] = [r for r in s["failure_classes"] if r["failure"] == "env_error"]
        assert env_error["count"] == 1 and not env_error["retryable"]
        assert "told to raise" in env_error["last_error"]
        assert s["failure_classes"][0] == env_error  # the most frequent first

        browser.get(server.url + "/")
        until(lambda: any(r and r[0] == "since the start" and r[1] == "5"
                          for r in rows("tr.latency-row")))
        failures = until(lambda: rows("tr.failure-row"))
        assert len(failures) == len(FAILURE_CLASSES)
        assert failures[0][:3] == ["env_error", "no", "1"] and "told to raise" in failures[0][5]
