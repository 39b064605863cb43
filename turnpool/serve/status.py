"""What ``/api/status`` (the status page's data) says about one server: its engine's
counters, its sessions, per worker the sessions it holds and their measured load, the step
rate and the recent step latency.
"""

from __future__ import annotations

import os
import time
from collections import Counter, deque
from typing import Any

from turnpool.serve.service import Service

#: Most sessions listed by ``/api/status`` (the page shows these).
MAX_LISTED_SESSIONS = 200


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


def status(service: Service, rate: StepRate, latency: dict[str, Any]) -> dict[str, Any]:
    """This server's ``/api/status`` (``latency``: `turnpool.serve.metrics.Metrics`'s
    recent percentiles, or empty)."""
    eng, table, settings = service.engine, service.sessions, service.settings
    now = time.monotonic()
    listed = sorted(table, key=lambda s: s.created)[:MAX_LISTED_SESSIONS]
    per_worker = sessions_per_worker(service)
    nodes = eng.worker_nodes()  # on Ray: where each runs
    return {
        "latency_p50_ms": latency.get("p50_ms"), "latency_p99_ms": latency.get("p99_ms"),
        "latency_buckets": latency.get("buckets") or [], "pid": os.getpid(),
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
    }


__all__ = ["MAX_LISTED_SESSIONS", "StepRate", "sessions_per_worker", "status"]
