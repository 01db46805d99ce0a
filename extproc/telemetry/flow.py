"""Flow-control gauges, read from the controller when Prometheus scrapes (nothing on the hot path)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from extproc.flow import FlowController


class FlowCollector(Collector):
    def __init__(self, flow: FlowController) -> None:
        self._flow = flow

    def collect(self) -> Iterator[GaugeMetricFamily]:
        queued = GaugeMetricFamily("extproc_flow_queued", "Requests waiting in the admission queue",
                                   labels=["pool", "class"])
        saturated = GaugeMetricFamily("extproc_flow_pool_saturated",
                                      "1 when the pool had no room at the last flow decision", labels=["pool"])
        stale = GaugeMetricFamily("extproc_flow_stale_decisions",
                                  "Flow decisions made without fresh vLLM metrics (counted as room) so far",
                                  labels=["pool"])
        for pool, stats in self._flow.stats().items():
            for klass in self._flow.config.classes:
                queued.add_metric([pool, klass], float(stats["queued"].get(klass, 0)))
            saturated.add_metric([pool], 1.0 if stats["saturated"] else 0.0)
            stale.add_metric([pool], float(stats["stale_decisions"]))
        yield queued
        yield saturated
        yield stale
