from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from extproc.bench.flowstats import FlowCounts, parse_flow_counts
from extproc.telemetry import GatewayMetrics


def test_counts_come_from_the_services_own_metrics() -> None:
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    before = parse_flow_counts(generate_latest(registry).decode())
    for klass, wait in (("standard", 0.2), ("standard", 1.5), ("critical", 3.0)):
        metrics.flow_wait_seconds.labels(klass).observe(wait)
    metrics.flow_rejected.labels("chat", "sheddable", "saturated").inc(4)
    after = parse_flow_counts(generate_latest(registry).decode())
    assert after - before == FlowCounts(queued=3, over_1s=2, rejected=4)
    assert (after - before).as_dict() == {"queued": 3, "waited_over_1s": 2, "rejected": 4}
