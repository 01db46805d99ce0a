from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from extproc.config.schema import SaturationConfig
from extproc.endpoints import EndpointMetrics, EndpointRegistry
from extproc.telemetry.pool_ttft import PoolTtftCollector


def test_pool_histogram_sums_its_endpoints() -> None:
    pools = EndpointRegistry().adopt([("chat", ["10.0.0.1:1", "10.0.0.2:1"]), ("idle", ["10.0.0.3:1"])])
    first, second = pools["chat"]
    rules = SaturationConfig()
    first.scraped(EndpointMetrics(0.0, ttft_buckets=((0.1, 2.0), (float("inf"), 3.0)), ttft_sum=0.5), 0, rules)
    second.scraped(EndpointMetrics(0.0, ttft_buckets=((0.1, 1.0), (float("inf"), 1.0)), ttft_sum=0.1), 0, rules)
    registry = CollectorRegistry()
    registry.register(PoolTtftCollector(lambda: pools.items()))
    text = generate_latest(registry).decode()
    assert 'extproc_pool_ttft_seconds_bucket{le="0.1",pool="chat"} 3.0' in text
    assert 'extproc_pool_ttft_seconds_bucket{le="+Inf",pool="chat"} 4.0' in text
    assert 'extproc_pool_ttft_seconds_count{pool="chat"} 4.0' in text
    assert 'pool="idle"' not in text  # no scrape with a histogram yet: no series
