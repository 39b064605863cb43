"""``/metrics`` of ``turnpool serve`` in Prometheus's text format (``prometheus-client``).

One registry per server (several servers may live in one process, as in the tests). The step
latency histogram is counted per step on the server (`StepLatency`: a bisect and two adds, in
plain Python, where ``prometheus_client``'s ``Histogram.observe`` takes a lock and walks the
buckets); it and everything else is read from the server's own counters when scraped, so a
scrape costs the hot path nothing:

* ``turnpool_step_latency_seconds`` (histogram): a step's time in the server, from its
  message to its reply (pool round trip included);
* ``turnpool_steps_total``, ``turnpool_resets_total``, ``turnpool_batches_total`` (counters;
  ``rate()`` gives steps/s) and ``turnpool_step_rate`` (the server's own recent steps/s);
* ``turnpool_failures_total{failure=...}`` (counter per class of
  `turnpool.worker.failures.FAILURE_CLASSES`);
* ``turnpool_sessions{kind=...}``, ``turnpool_slots_capacity``, ``turnpool_slots_leased``,
  ``turnpool_worker_sessions{worker=...}``, ``turnpool_worker_load{worker=...}`` (gauges:
  sessions per kind, and per worker how many of its slots sessions hold and their measured
  step cost in seconds, which decides where a new session goes).

`Metrics.recent_latency` gives the status page the step latency histogram counts since its
last call and since the start, read from the same histogram (over
`turnpool.serve.status.BUCKETS`; `turnpool.serve.status.quantiles` reads them).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Iterator
from typing import Any

from turnpool.extras import require
from turnpool.serve.service import Service
from turnpool.serve.status import BUCKETS, StepRate, quantiles, sessions_per_worker
from turnpool.worker.failures import FAILURE_CLASSES

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    """The registry of one server; ``observe_step`` is the only call on the hot path.
    Without ``prometheus-client``, `turnpool.extras.MissingExtra` (the serve extra)."""

    def __init__(self, service: Service, rate: StepRate) -> None:
        client = require("prometheus_client", feature="/metrics of turnpool serve",
                         extra="serve")
        self.registry = client.CollectorRegistry(auto_describe=False)
        self._latency = StepLatency()
        self.observe_step = self._latency.observe
        #: the bucket counts at the last `recent_latency` call
        self._previous: list[float] | None = None
        self.registry.register(_ServerCollector(service, rate, self._latency))

    def recent_latency(self) -> dict[str, Any]:
        """Step latency p50 / p99 in ms over the steps since the previous call (`quantiles`),
        the histogram's cumulative counts of those steps (``buckets``) and of every step
        since the server started (``total_buckets``)."""
        counts = self._bucket_counts()
        previous, self._previous = self._previous, counts
        delta = [c - (previous[k] if previous else 0.0) for k, c in enumerate(counts)]
        return {**quantiles(delta), "buckets": delta, "total_buckets": counts}

    def _bucket_counts(self) -> list[float]:
        """The histogram's cumulative bucket counts, ``+Inf`` last."""
        return self._latency.cumulative()

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        out: bytes = generate_latest(self.registry)
        return out


class StepLatency:
    """The step latency histogram over `BUCKETS` (and ``+Inf``), counted on the event loop.

    Example:
        >>> latency = StepLatency()
        >>> latency.observe(0.0015); latency.observe(0.002); latency.observe(99.0)
        >>> latency.cumulative()[:3], latency.cumulative()[-1]
        ([0.0, 0.0, 2.0], 3.0)
    """

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        # a bucket's bound is inclusive (Prometheus's ``le``): the first bound >= seconds
        self.counts[bisect_left(BUCKETS, seconds)] += 1
        self.sum += seconds

    def cumulative(self) -> list[float]:
        out, seen = [], 0
        for count in list(self.counts):
            seen += count
            out.append(float(seen))
        return out

    def family(self) -> Any:
        from prometheus_client.core import HistogramMetricFamily

        bounds = [*(repr(float(b)) for b in BUCKETS), "+Inf"]
        return HistogramMetricFamily(
            "turnpool_step_latency_seconds", "A step's time in the server, message to reply",
            buckets=list(zip(bounds, self.cumulative(), strict=True)), sum_value=self.sum)


class _ServerCollector:
    """Reads the engine's and the sessions' counters at scrape time."""

    def __init__(self, service: Service, rate: StepRate, latency: StepLatency) -> None:
        self.service = service
        self.rate = rate
        self.latency = latency

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        yield self.latency.family()
        service = self.service
        engine = service.engine
        for name, value, help_text in (
                ("turnpool_steps", engine.steps_total, "Env steps served"),
                ("turnpool_resets", engine.resets_total, "Episodes started"),
                ("turnpool_batches", engine.batches_total, "Pool calls that carried steps")):
            yield CounterMetricFamily(name, help_text, value=value)
        failures = CounterMetricFamily("turnpool_failures", "Failed env turns by class",
                                       labels=["failure"])
        for failure in FAILURE_CLASSES:
            failures.add_metric([failure], engine.failures.get(failure, 0))
        yield failures
        yield GaugeMetricFamily("turnpool_step_rate", "Recent steps per second",
                                value=self.rate.rate())
        sessions = GaugeMetricFamily("turnpool_sessions", "Open sessions by kind",
                                     labels=["kind"])
        kinds = Counter(s.kind for s in service.sessions)
        for kind in ("ws", "http", "mcp", "once"):
            sessions.add_metric([kind], kinds.get(kind, 0))
        yield sessions
        yield GaugeMetricFamily("turnpool_slots_capacity", "Env slots", value=engine.capacity)
        yield GaugeMetricFamily("turnpool_slots_leased", "Env slots held by sessions",
                                value=engine.leased)
        per_worker = sessions_per_worker(service)
        workers = GaugeMetricFamily("turnpool_worker_sessions",
                                    "Sessions whose env slot a worker holds", labels=["worker"])
        for w in range(engine.num_workers):
            workers.add_metric([str(w)], per_worker.get(w, 0))
        yield workers
        load = GaugeMetricFamily("turnpool_worker_load",
                                 "Measured step cost (s) of the slots a worker's sessions hold",
                                 labels=["worker"])
        for w, cost in enumerate(list(engine.load)):
            load.add_metric([str(w)], cost)
        yield load
