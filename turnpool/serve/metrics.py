"""``/metrics`` of ``turnpool serve`` in Prometheus's text format (``prometheus-client``).

One registry per server (several servers may live in one process, as in the tests). The step
latency histogram is observed per step on the server; everything else is read from the
engine's and the sessions' own counters when scraped, so a scrape costs the hot path nothing:

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
        self._latency = client.Histogram("turnpool_step_latency_seconds",
                                  "A step's time in the server, message to reply",
                                  buckets=BUCKETS, registry=self.registry)
        self.observe_step = self._latency.observe
        #: the bucket counts at the last `recent_latency` call
        self._previous: list[float] | None = None
        self.registry.register(_ServerCollector(service, rate))

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
        samples = [x for metric in self._latency.collect() for x in metric.samples
                   if x.name.endswith("_bucket")]
        return [float(x.value) for x in samples]

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        out: bytes = generate_latest(self.registry)
        return out


class _ServerCollector:
    """Reads the engine's and the sessions' counters at scrape time."""

    def __init__(self, service: Service, rate: StepRate) -> None:
        self.service = service
        self.rate = rate

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

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
