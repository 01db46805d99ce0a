from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from extproc.server.workers import merge_metrics


def page(requests: float, in_flight: float, latency: float) -> str:
    registry = CollectorRegistry()
    Counter("extproc_requests", "Requests.", ["pool"], registry=registry).labels("a").inc(requests)
    Gauge("extproc_in_flight", "In flight.", registry=registry).set(in_flight)
    Histogram("extproc_seconds", "Latency.", buckets=(0.1, 1.0), registry=registry).observe(latency)
    return generate_latest(registry).decode()


def test_every_workers_samples_keep_their_family_and_gain_a_worker_label() -> None:
    merged = merge_metrics([("0", page(3, 1, 0.05)), ("1", page(5, 2, 0.5))]).decode()
    families = {f.name: f for f in text_string_to_metric_families(merged)}
    assert families["extproc_requests"].type == "counter"
    assert families["extproc_seconds"].type == "histogram"
    totals = {(s.labels["worker"], s.labels["pool"]): s.value for s in families["extproc_requests"].samples
              if s.name == "extproc_requests_total"}
    assert totals == {("0", "a"): 3.0, ("1", "a"): 5.0}
    assert {s.labels["worker"]: s.value for s in families["extproc_in_flight"].samples} == {"0": 1.0, "1": 2.0}
    buckets = {(s.labels["worker"], s.labels["le"]): s.value for s in families["extproc_seconds"].samples
               if s.name == "extproc_seconds_bucket"}
    assert buckets[("0", "0.1")] == 1.0 and buckets[("1", "0.1")] == 0.0 and buckets[("1", "1.0")] == 1.0
    # One HELP/TYPE per family: the page parses as one family each, not one per worker.
    assert merged.count("# TYPE extproc_requests_total counter") + merged.count("# TYPE extproc_requests counter") == 1


def test_no_worker_pages_is_an_empty_page() -> None:
    assert merge_metrics([]) == b""
