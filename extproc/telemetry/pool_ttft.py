"""TTFT per pool as the engines measure it: the sum of every endpoint's vllm:time_to_first_token histogram.

Envoy can time only the first upstream byte, which for SSE is the response headers (sent before the
first token), so a real TTFT comes from vLLM itself. The buckets are cumulative totals of the last scrape
of each endpoint; query them with rate() as usual (a restarted vLLM resets its counters, like any counter).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from extproc.telemetry.pools import Pools


def _bound(value: float) -> str:
    return "+Inf" if math.isinf(value) else repr(float(value))


class PoolTtftCollector(Collector):
    def __init__(self, pools: Pools) -> None:
        self._pools = pools

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(
            "extproc_pool_ttft_seconds", "Time to first token per pool, from the vLLM servers' own histograms",
            labels=["pool"],
        )
        for name, members in self._pools():
            buckets: dict[float, float] = {}
            total_sum = 0.0
            for endpoint in members:
                metrics = endpoint.metrics
                if metrics is None or not metrics.ttft_buckets:
                    continue
                for upper, count in metrics.ttft_buckets:
                    buckets[upper] = buckets.get(upper, 0.0) + count
                total_sum += metrics.ttft_sum
            if not buckets:
                continue
            if math.inf not in buckets:
                buckets[math.inf] = max(buckets.values())
            family.add_metric([name], [(_bound(b), c) for b, c in sorted(buckets.items())], total_sum)
        yield family
