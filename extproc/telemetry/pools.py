"""Per-pool gauges, computed when Prometheus scrapes (nothing on the hot path): how many endpoints a pool
has and how many take traffic, and the engines' own load from the last fresh scrape of each endpoint.

They are the inputs of an autoscaler for the vLLM pools. vLLM's queue alone under-reports demand when flow
control holds requests in the gateway (it keeps the engines' queues short on purpose), so scale on
vLLM waiting + the gateway's admission queue per ready endpoint (README "Metrics" has the query). Every
service replica scrapes the same engines: aggregate these with max() across replicas, not sum().
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from extproc.endpoints import Endpoint
from extproc.endpoints.health import HealthTracker

# The current pools: (name, endpoints), read at each collection.
Pools = Callable[[], Iterable[tuple[str, Sequence[Endpoint]]]]


class PoolCollector(Collector):
    def __init__(self, pools: Pools, health: HealthTracker, stale_after_s: Callable[[], float],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._pools = pools
        self._health = health
        self._stale_after_s = stale_after_s  # the current policy's scrape staleness bound
        self._clock = clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = {
            "endpoints": GaugeMetricFamily("extproc_pool_endpoints", "Endpoints of the pool (configured or "
                                           "discovered)", labels=["pool"]),
            "ready": GaugeMetricFamily("extproc_pool_endpoints_ready", "Endpoints taking traffic: scrapes not "
                                       "failing, circuit breaker not open", labels=["pool"]),
            "waiting": GaugeMetricFamily("extproc_pool_requests_waiting", "Sum of vllm:num_requests_waiting "
                                         "over the pool's freshly scraped endpoints", labels=["pool"]),
            "running": GaugeMetricFamily("extproc_pool_requests_running", "Sum of vllm:num_requests_running "
                                         "over the pool's freshly scraped endpoints", labels=["pool"]),
            "kv": GaugeMetricFamily("extproc_pool_kv_cache_usage", "Mean vllm:kv_cache_usage_perc (0-1) over "
                                    "the pool's freshly scraped endpoints", labels=["pool"]),
        }
        now = self._clock()
        stale_after_s = self._stale_after_s()
        for name, members in self._pools():
            fresh = [e.metrics for e in members
                     if e.metrics is not None and now - e.metrics.scraped_at <= stale_after_s]
            families["endpoints"].add_metric([name], float(len(members)))
            families["ready"].add_metric([name], float(len(self._health.usable(members, now))))
            families["waiting"].add_metric([name], sum(m.waiting for m in fresh))
            families["running"].add_metric([name], sum(m.running for m in fresh))
            if fresh:
                families["kv"].add_metric([name], sum(m.kv_usage for m in fresh) / len(fresh))
        yield from families.values()
