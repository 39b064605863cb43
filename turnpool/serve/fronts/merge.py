"""One answer for a server of several fronts: ``/api/status`` and ``/metrics`` merged from
each front's own (sums, workers and metrics labelled by ``front``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from turnpool.serve.status import MAX_LISTED_SESSIONS, derived, quantiles

_SUMMED = ("num_workers", "capacity", "active_sessions", "steps_total", "resets_total",
           "batches_total", "step_rate", "refused_sessions", "reaped_sessions")


def merge_status(parts: dict[int, dict[str, Any]], count: int) -> dict[str, Any]:
    """One ``/api/status`` from the fronts' own: totals summed, workers and sessions listed
    with their front, latency percentiles from the summed histogram counts."""
    first = parts[min(parts)]
    out = {k: v for k, v in first.items() if k not in ("pid", "placement")}
    for key in (*_SUMMED, "passed_out", "passed_in"):
        out[key] = sum(p.get(key) or 0 for p in parts.values())
    failures: Counter[str] = Counter()
    for p in parts.values():
        failures.update(p.get("failures") or {})
    out["failures"] = dict(failures)
    out["uptime_s"] = max(p.get("uptime_s") or 0.0 for p in parts.values())
    out["recent_failures"] = [f for p in parts.values() for f in p.get("recent_failures") or []]
    out["workers"] = [{**w, "front": k} for k, p in sorted(parts.items())
                      for w in p.get("workers") or []]
    sessions = [s for p in parts.values() for s in p.get("sessions") or []]
    out["sessions"] = sessions[:MAX_LISTED_SESSIONS]
    buckets = [p.get("latency_buckets") for p in parts.values()]
    summed = [sum(col) for col in zip(*[b for b in buckets if b])] if any(buckets) else []
    latency = quantiles(summed)
    out["latency_p50_ms"], out["latency_p99_ms"] = latency["p50_ms"], latency["p99_ms"]
    out["latency_buckets"] = summed
    totals = [p.get("latency_total_buckets") for p in parts.values()]
    out["latency_total_buckets"] = [sum(col) for col in zip(*[b for b in totals if b])]
    derived(out)  # quantiles and failure classes of the sums
    out["frontends"] = [
        {"front": k, "up": k in parts,
         **({key: parts[k].get(key) for key in ("pid", "active_sessions", "step_rate",
                                                "capacity", "passed_out", "passed_in",
                                                "placement")}
            if k in parts else {})}
        for k in range(count)]
    return out


def merge_metrics(texts: dict[int, str]) -> bytes:
    """One Prometheus exposition from the fronts' own, every sample labelled ``front``."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.metrics_core import Metric
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.samples import Sample

    families: dict[str, Metric] = {}
    for k, text in sorted(texts.items()):
        for fam in text_string_to_metric_families(text):
            merged = families.get(fam.name)
            if merged is None:
                merged = families[fam.name] = Metric(fam.name, fam.documentation, fam.type)
            merged.samples.extend(
                Sample(s.name, {**s.labels, "front": str(k)}, s.value, s.timestamp, s.exemplar)
                for s in fam.samples)

    class _Merged:
        def collect(self) -> Iterable[Metric]:
            return list(families.values())

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged())  # type: ignore[arg-type]
    out: bytes = generate_latest(registry)
    return out


__all__ = ["merge_metrics", "merge_status"]
