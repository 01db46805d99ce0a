"""Policy models of what the service learns about endpoints (mounted by `extproc.config.schema`): how their
metrics are scraped (`scheduling.scrape`), when one is full (`saturation`), when one is unhealthy (`health`),
and where a pool finds them in DNS (`pools[].discovery`).

`extproc.config` mounts these, so nothing in `extproc.endpoints` may import `extproc.config` (a cycle).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from extproc.policy_types import Port, Strict

__all__ = ["DnsDiscovery", "HealthPolicy", "SaturationConfig", "ScrapeConfig"]


class ScrapeConfig(Strict):
    """Polling of each vLLM endpoint's /metrics."""

    enabled: bool = True
    interval_ms: int = Field(default=100, ge=10, le=60_000)
    timeout_ms: int = Field(default=500, ge=10, le=60_000)
    # Older metrics are ignored by scorers (they fall back to this process's own in-flight counts).
    stale_after_ms: int = Field(default=1000, ge=50)


class SaturationConfig(Strict):
    """When an endpoint counts as full: one definition for flow control and the scheduler's saturation filter
    (README "Saturation"). Metrics older than `scheduling.scrape.stale_after_ms` never make one full."""

    max_kv_utilization: float = Field(default=0.95, gt=0, le=1.0,
                                      description="vllm:kv_cache_usage_perc (0..1) at which an engine with "
                                                  "requests waiting is full")
    sustain_ms: int = Field(default=1000, ge=0, le=60_000,
                            description="an engine queue (vllm:num_requests_waiting > 0) must last this long, over "
                                        "3 scrapes or more, before it means full: vLLM queues arrivals between "
                                        "steps on an idle engine too")
    capacity_ttl_s: float = Field(default=10.0, gt=0,
                                  description="a learned capacity (requests at which the engine queued) grows by "
                                              "one request per this many seconds until the engine queues again")


class HealthPolicy(Strict):
    """Our own passive health (circuit breaker per endpoint) and active check (metrics scrapes)."""

    consecutive_failures: int = Field(default=3, ge=1, description="5xx / resets in a row that eject")
    base_ejection_s: float = Field(default=5.0, gt=0, description="first ejection; doubles on each repeat")
    max_ejection_s: float = Field(default=60.0, gt=0)
    max_ejected_percent: float = Field(default=50.0, ge=0, le=100, description="of a pool, by passive ejection")
    scrape_failures: int = Field(default=3, ge=1, description="failed scrapes in a row = unavailable")


class DnsDiscovery(Strict):
    """Endpoints from DNS A/AAAA records, e.g. a Kubernetes headless Service, re-resolved on an interval.

    Envoy resolves the same name itself (a STRICT_DNS cluster), so both see the same endpoints.
    """

    dns: str = Field(min_length=1, max_length=253)
    port: Port
    interval_s: float = Field(default=5.0, ge=0.5, le=3600)
    family: Literal["any", "v4", "v6"] = "any"
