"""What ``/api/status`` (the status page's data) says about one server: its engine's
counters, its sessions, per worker the sessions it holds and their measured load, the step
rate, step latency quantiles (since the last status call and since the start) and failures by
class.

`derived` computes the last two from the raw counts (histogram buckets, failure counters), so
a server of several fronts sums the raw counts and derives once
(`turnpool.serve.fronts.merge`).

    >>> rows = failure_classes({"timeout": 3, "env_error": 1}, [], steps=1000)
    >>> [(r["failure"], r["count"], r["retryable"], r["per_1k_steps"]) for r in rows][:2]
    [('timeout', 3, True, 3.0), ('env_error', 1, False, 1.0)]
"""

from __future__ import annotations

import os
import time
from collections import Counter, deque
from typing import Any

from turnpool.serve.service import Service
from turnpool.worker.failures import FAILURE_CLASSES

#: Most sessions listed by ``/api/status`` (the page shows these).
MAX_LISTED_SESSIONS = 200
#: Step latency buckets (seconds): sub-millisecond steps to a full deadline.
BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
           10.0, 30.0, 60.0)
#: the step latency quantiles the status page shows
LATENCY_QUANTILES = (0.5, 0.9, 0.99, 0.999)


class StepRate:
    """Steps per second over the last samples (one per session-table sweep, about 16 s)."""

    def __init__(self, service: Service) -> None:
        self.engine = service.engine
        self.started = time.time()
        self._samples: deque[tuple[float, int]] = deque(maxlen=16)

    def tick(self, now: float) -> None:
        self._samples.append((now, self.engine.steps_total))

    def rate(self) -> float:
        if len(self._samples) >= 2:
            (t0, n0), (t1, n1) = self._samples[0], self._samples[-1]
            return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0
        return 0.0


def sessions_per_worker(service: Service) -> Counter[int]:
    """How many sessions hold a slot of each worker (the engine says whose slot is whose)."""
    return Counter(service.engine.worker_of(s.slot) for s in service.sessions)


def quantiles(cumulative: list[float], qs: tuple[float, ...] = (0.5, 0.99)
              ) -> dict[str, float | None]:
    """Quantiles ``qs`` in ms (keys ``p50_ms``, ``p99.9_ms``, ...) from cumulative histogram
    counts over `BUCKETS` (``+Inf`` last): the upper bound of the bucket each falls in; None
    without steps, or past the last finite bucket.

    >>> quantiles([0, 1, 2] + [4] * 14, (0.5, 0.9, 0.999))
    {'p50_ms': 2.0, 'p90_ms': 5.0, 'p99.9_ms': 5.0}
    """
    total = cumulative[-1] if cumulative else 0.0
    out: dict[str, float | None] = {f"p{100 * q:g}_ms": None for q in qs}
    if total <= 0:
        return out
    bounds = [*BUCKETS, float("inf")]
    for q in qs:
        k = next(k for k, c in enumerate(cumulative) if c >= q * total)
        out[f"p{100 * q:g}_ms"] = bounds[k] * 1000.0 if bounds[k] != float("inf") else None
    return out


def failure_classes(failures: dict[str, int], recent: list[dict[str, Any]], steps: int
                    ) -> list[dict[str, Any]]:
    """One row per failure class (`FAILURE_CLASSES`, every one, most frequent first): its
    count, whether it is retryable, its share of the failures, per 1000 steps served, and
    the latest error of that class among the ``recent`` failures."""
    total = sum(failures.values())
    latest = {f["failure"]: f for f in recent}  # oldest first: the last one wins
    rows = []
    for name, retryable in FAILURE_CLASSES.items():
        n = int(failures.get(name, 0))
        last = latest.get(name)
        rows.append({"failure": name, "retryable": retryable, "count": n,
                     "share": n / total if total else 0.0,
                     "per_1k_steps": 1000.0 * n / steps if steps else None,
                     "last_error": last["error"] if last else None,
                     "last_time": last["time"] if last else None})
    return sorted(rows, key=lambda r: -r["count"])  # stable: ties keep the class order


def derived(out: dict[str, Any]) -> dict[str, Any]:
    """``out`` (a status) with what is computed from its raw counts: ``latency_quantiles``
    (``recent``: since the last status call, ``since_start``; each with its ``steps``) and
    ``failure_classes``."""
    out["latency_quantiles"] = {
        when: {**quantiles(buckets, LATENCY_QUANTILES),
               "steps": int(buckets[-1]) if buckets else 0}
        for when, buckets in (("recent", out.get("latency_buckets") or []),
                              ("since_start", out.get("latency_total_buckets") or []))}
    out["failure_classes"] = failure_classes(out.get("failures") or {},
                                             out.get("recent_failures") or [],
                                             int(out.get("steps_total") or 0))
    return out


def status(service: Service, rate: StepRate, latency: dict[str, Any]) -> dict[str, Any]:
    """This server's ``/api/status`` (``latency``: `turnpool.serve.metrics.Metrics`'s
    recent percentiles and histogram counts, or empty)."""
    eng, table, settings = service.engine, service.sessions, service.settings
    now = time.monotonic()
    listed = sorted(table, key=lambda s: s.created)[:MAX_LISTED_SESSIONS]
    per_worker = sessions_per_worker(service)
    nodes = eng.worker_nodes()  # on Ray: where each runs
    return derived({
        "latency_p50_ms": latency.get("p50_ms"), "latency_p99_ms": latency.get("p99_ms"),
        "latency_buckets": latency.get("buckets") or [],
        "latency_total_buckets": latency.get("total_buckets") or [], "pid": os.getpid(),
        "passed_out": 0, "passed_in": 0,
        "workers": [{"sessions": per_worker.get(w, 0), "load": load, "node": node}
                    for w, (load, node) in enumerate(zip(list(eng.load), nodes,
                                                         strict=False))],
        "env": settings.env, "backend": eng.backend_name,
        "num_workers": eng.num_workers, "capacity": eng.capacity,
        "active_sessions": len(table), "uptime_s": time.time() - rate.started,
        "steps_total": eng.steps_total, "resets_total": eng.resets_total,
        "batches_total": eng.batches_total, "step_rate": rate.rate(),
        "failures": dict(eng.failures), "recent_failures": list(eng.recent_failures),
        "refused_sessions": table.refused, "reaped_sessions": table.reaped,
        "session_timeout_s": settings.session_timeout,
        "step_timeout_s": settings.step_timeout,
        "sessions": [{"id": s.id, "kind": s.kind, "slot": s.slot,
                      "episode_id": s.episode_id, "seed": s.seed,
                      "step_count": s.step_count, "done": s.done,
                      "failures": s.failures,
                      "idle_s": round(now - s.last_active, 1)} for s in listed],
    })


__all__ = ["BUCKETS", "LATENCY_QUANTILES", "MAX_LISTED_SESSIONS", "StepRate", "derived",
           "failure_classes", "quantiles", "sessions_per_worker", "status"]
