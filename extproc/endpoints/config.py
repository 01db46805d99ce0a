"""Policy models of what the service learns about endpoints (mounted by `extproc.config.schema`): how their
metrics are scraped (`scheduling.scrape`), when one is full (`saturation`), when one is unhealthy (`health`),
and where a pool finds them: DNS (`pools[].discovery`) or a watched InferencePool (`pools[].inference_pool`).

`extproc.config` mounts these, so nothing in `extproc.endpoints` may import `extproc.config` (a cycle).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from extproc.policy_types import Port, Strict

__all__ = ["DnsDiscovery", "HealthPolicy", "InferencePoolSource", "SaturationConfig", "ScrapeConfig"]

# Kubernetes object names: DNS-1123 subdomain (an InferencePool) and label (a namespace).
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class ScrapeConfig(Strict):
    """Polling of each vLLM endpoint's /metrics."""

    enabled: bool = True
    interval_ms: int = Field(default=100, ge=10, le=60_000)
    timeout_ms: int = Field(default=500, ge=10, le=60_000)
    # Older metrics are ignored by scorers (they fall back to this process's own in-flight counts).
    stale_after_ms: int = Field(default=1000, ge=50)
    # With the replicas' in-flight exchange (extproc.server.fleet): each endpoint is scraped by one replica for
    # all (extproc.endpoints.shared_metrics), so the engines' scrape load does not grow with the replicas.
    # (Off from 916377b to session 17, when flow control at 0.9x load with 3 replicas refused 3 requests with it on;
    # shared scrapes carry the replicas' in-flight count of their moment since 6a5aa3d, and three runs of that point
    # with it on and off since showed no refusal either way: reports/i15-s17/overload-share.)
    share: bool = True
    # Each round's scrapes start spread over the first half of the interval, each endpoint at its own fixed offset
    # (its place in the registry), instead of all at once: one round's parses (~165 us each) do not block this
    # process's event loop in one burst, and the engines' /metrics pages are not all asked for at the same instant.
    # Off by default: at 8 engines, uniform 40% / 80% load, it cost the service +10% CPU (one loop wake-up per
    # scrape instead of one per round) and its inbound-hop gain (-0.6 ms p90 in two runs) did not replicate in a
    # third (reports/i15-s14/hop).
    stagger: bool = False


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


class InferencePoolSource(Strict):
    """A pool's endpoints from a watched `InferencePool` (inference.networking.k8s.io/v1) and its ready pods:
    `podIP:port` for every one of the pool's `targetPorts`, for every pod its selector matches that is Ready."""

    name: str = Field(min_length=1, max_length=253)
    # "" = the namespace of the service's own pod (its service account's namespace file), else `default`.
    namespace: str = Field(default="", max_length=63)
    # The Kubernetes API: in the cluster by default (service account token and CA); `kubeconfig` for a
    # service run outside; `api_server` names the server directly (with `token_file` / `ca_file` if it needs
    # them; http:// only for tests and local proxies such as `kubectl proxy`).
    api_server: str | None = None
    kubeconfig: str | None = None
    token_file: str | None = None
    ca_file: str | None = None
    # A failed list or watch is retried after a delay doubling from backoff_initial_s up to backoff_max_s
    # (with jitter); a watch is re-opened after watch_timeout_s (the API server's own bound on a watch).
    backoff_initial_s: float = Field(default=0.5, gt=0, le=60)
    backoff_max_s: float = Field(default=30.0, gt=0, le=600)
    watch_timeout_s: int = Field(default=300, ge=10, le=3600)

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not _SUBDOMAIN.match(value):
            raise ValueError(f"InferencePool name {value!r} is not a Kubernetes object name")
        return value

    @field_validator("namespace")
    @classmethod
    def _valid_namespace(cls, value: str) -> str:
        if value and not _LABEL.match(value):
            raise ValueError(f"namespace {value!r} is not a Kubernetes namespace name")
        return value

    @field_validator("kubeconfig", "token_file", "ca_file")
    @classmethod
    def _absolute_paths(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"{value!r} must be an absolute path")
        return value

    @field_validator("api_server")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("https://", "http://")):
            raise ValueError(f"api_server {value!r} must be an https:// (or http://) URL")
        return value
