from __future__ import annotations

from prometheus_client import CollectorRegistry

from extproc.endpoints import EndpointMetrics, EndpointRegistry
from extproc.endpoints.health import HealthConfig, HealthTracker
from extproc.telemetry.pools import PoolCollector


def test_pool_gauges_count_ready_endpoints_and_fresh_engine_load() -> None:
    endpoints = EndpointRegistry()
    endpoints.sync([("chat", ["10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1", "10.0.0.4:1"]), ("idle", ["10.0.1.1:1"])])
    pool = endpoints.pool("chat")
    assert pool is not None
    a, b, c, d = pool.endpoints
    a.metrics = EndpointMetrics(9.5, running=8, waiting=3, kv_usage=0.5)
    b.metrics = EndpointMetrics(9.8, running=6, waiting=1, kv_usage=0.7)
    c.metrics = EndpointMetrics(5.0, running=50, waiting=40, kv_usage=1.0)  # 5 s old: stale, not counted
    d.scrape_failures = 3  # unreachable
    health = HealthTracker(HealthConfig(consecutive_failures=1, max_ejected_percent=100))
    assert health.record(b.address, False, 9.0, pool.endpoints)  # b's breaker opens
    registry = CollectorRegistry()
    registry.register(PoolCollector(endpoints, health, lambda: 1.0, clock=lambda: 10.0))

    def value(name: str, pool_name: str = "chat") -> float | None:
        return registry.get_sample_value(name, {"pool": pool_name})

    assert value("extproc_pool_endpoints") == 4.0
    assert value("extproc_pool_endpoints_ready") == 2.0  # a and c (b ejected, d failing its scrapes)
    assert value("extproc_pool_requests_waiting") == 4.0  # a + b: what the engines last said, fresh only
    assert value("extproc_pool_requests_running") == 14.0
    assert value("extproc_pool_kv_cache_usage") == 0.6
    assert (value("extproc_pool_endpoints", "idle"), value("extproc_pool_requests_waiting", "idle")) == (1.0, 0.0)
    assert value("extproc_pool_kv_cache_usage", "idle") is None  # never scraped: no KV figure
