from __future__ import annotations

from prometheus_client import CollectorRegistry

from extproc.config.schema import HealthPolicy, SaturationConfig
from extproc.endpoints import Endpoint, EndpointMetrics
from extproc.endpoints.health import HealthTracker
from extproc.telemetry.pools import PoolCollector


def test_pool_gauges_count_ready_endpoints_and_fresh_engine_load() -> None:
    chat = [Endpoint(f"10.0.0.{i}:1") for i in range(1, 5)]
    pools = [("chat", chat), ("idle", [Endpoint("10.0.1.1:1")])]
    a, b, c, d = chat
    rules = SaturationConfig()
    a.scraped(EndpointMetrics(9.5, running=8, waiting=3, kv_usage=0.5), 0, rules)
    b.scraped(EndpointMetrics(9.8, running=6, waiting=1, kv_usage=0.7), 0, rules)
    c.scraped(EndpointMetrics(5.0, running=50, waiting=40, kv_usage=1.0), 0, rules)  # 5 s old: stale, not counted
    for _ in range(3):
        d.scrape_failed()  # unreachable
    policy = HealthPolicy(consecutive_failures=1, max_ejected_percent=100)
    health = HealthTracker(lambda: policy)
    assert health.record(b.address, False, 9.0, chat)  # b's breaker opens
    registry = CollectorRegistry()
    registry.register(PoolCollector(lambda: pools, health, lambda: 1.0, clock=lambda: 10.0))

    def value(name: str, pool_name: str = "chat") -> float | None:
        return registry.get_sample_value(name, {"pool": pool_name})

    assert value("extproc_pool_endpoints") == 4.0
    assert value("extproc_pool_endpoints_ready") == 2.0  # a and c (b ejected, d failing its scrapes)
    assert value("extproc_pool_requests_waiting") == 4.0  # a + b: what the engines last said, fresh only
    assert value("extproc_pool_requests_running") == 14.0
    assert value("extproc_pool_kv_cache_usage") == 0.6
    assert (value("extproc_pool_endpoints", "idle"), value("extproc_pool_requests_waiting", "idle")) == (1.0, 0.0)
    assert value("extproc_pool_kv_cache_usage", "idle") is None  # never scraped: no KV figure
