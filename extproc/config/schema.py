"""Policy file schema: what an operator writes in YAML, validated strictly.

Every model is frozen, so a loaded policy is an immutable snapshot that can be shared by every
request in flight while a reload builds the next one.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from extproc.flow.config import FlowControlConfig
from extproc.guard.config import GuardConfig
from extproc.rollout.config import RolloutPolicy, check_splits

_NAME = re.compile(r"^[a-z0-9]([a-z0-9_.-]{0,61}[a-z0-9])?$")
_HEADER = re.compile(r"^[a-z0-9-]+$")

Port = Annotated[int, Field(ge=1, le=65535)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def parse_endpoint(text: str) -> tuple[str, int]:
    """Split `ip:port` (IPv6 as `[ip]:port`); Envoy's override_host needs literal IPs."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ValueError(f"endpoint {text!r} must be ip:port")
    host = host.removeprefix("[").removesuffix("]")
    try:
        ipaddress.ip_address(host)
    except ValueError as exc:
        raise ValueError(f"endpoint {text!r}: {host!r} is not an IP address") from exc
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ValueError(f"endpoint {text!r}: port out of range")
    return host, port


class ServiceConfig(_Strict):
    """Where our own servers listen, and the secrets that protect them (README "Security model")."""

    grpc_host: str = "127.0.0.1"
    grpc_port: Port = 9002
    admin_host: str = "127.0.0.1"
    admin_port: Port = 9003
    # A file holding a shared secret: ext_proc and access-log streams must carry it as gRPC metadata
    # `x-extproc-token` (the rendered Envoy config sends it); unset = the gRPC port must be reachable by
    # Envoy alone (loopback, a NetworkPolicy, mTLS). Read at start.
    grpc_token_file: str | None = None
    # A file holding the admin token: /debug/* and /rollouts/* need `Authorization: Bearer <token>`;
    # unset = they answer only on loopback connections. /metrics, /healthz and /readyz stay open.
    admin_token_file: str | None = None
    # /debug/explain calls per second (burst twice that), over every caller.
    explain_per_s: float = Field(default=5.0, gt=0, le=1000)

    @field_validator("grpc_token_file", "admin_token_file")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"{value!r} must be an absolute path (Envoy's renderer reads it too)")
        return value


class BoundsConfig(_Strict):
    """Hard limits on what a client may send; over them the request is refused, never crashes us."""

    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    max_json_depth: int = Field(default=32, ge=2, le=256)
    # Element counts, checked before any per-element work (decoding itself is bounded by max_body_bytes).
    max_json_containers: int = Field(default=20_000, ge=16, le=10_000_000)
    max_messages: int = Field(default=2048, ge=1, le=1_000_000)
    max_choices: int = Field(default=128, ge=1, le=100_000, description="n / best_of")
    # Per tenant and process: decision CPU time it may spend per second (a bucket holding
    # tenant_parse_burst_ms); over it its requests get 429 before their bodies are parsed. 0 = no budget.
    tenant_parse_ms_per_s: float = Field(default=500.0, ge=0, le=1000)
    tenant_parse_burst_ms: float = Field(default=2000.0, ge=1, le=600_000)
    # CPU time one decision may take (checked between its stages); over it the request gets 413. 0 = none.
    decision_cpu_ms: float = Field(default=250.0, ge=0, le=60_000)


class EnvoyConfig(_Strict):
    """Settings for the Envoy files `extproc envoy render` writes."""

    listen_host: str = "127.0.0.1"
    listen_port: Port = 8080
    admin_port: Port = 9901
    # ext_proc service replicas Envoy balances streams over; empty = the one in `service`.
    extproc_endpoints: tuple[str, ...] = ()
    cluster_header: str = "x-gateway-pool"
    endpoint_header: str = "x-gateway-destination-endpoint"
    # ext_proc: how long Envoy waits for each of our replies before applying failure_mode_allow.
    message_timeout_ms: int = Field(default=1000, ge=10, le=60_000)
    # Requests the service did not route (it was unreachable, too slow, or died before its reply):
    # false = fail closed, Envoy answers 500; true = fail open, they go to `fallback_pool` (client routing
    # headers are still stripped, so nobody can pick a pool or endpoint by header). Either way a request
    # the service did route runs to its end even if the service dies meanwhile (extproc/xds/render.py).
    failure_mode_allow: bool = False
    fallback_pool: str | None = None
    # Retries on connect failure / refused stream / reset before any response, each to another endpoint.
    retries: int = Field(default=2, ge=0, le=10)
    route_timeout_s: float = Field(default=600.0, ge=0)
    stream_idle_timeout_s: float = Field(default=300.0, ge=1)
    # Slow clients: all request headers within this, the whole request (body upload, and the wait in the
    # admission queue before it is sent on) within request_timeout_s (0 = no limit; unset = the longest
    # flow-control wait + message timeout + 30 s, at least 60 s; set, it must exceed that wait + timeout).
    request_headers_timeout_s: float = Field(default=10.0, gt=0, le=3600)
    request_timeout_s: float | None = Field(default=None, ge=0, le=86_400)
    # Adds `x-gateway-upstream-host` to responses (the vLLM endpoint that served). Useful for demos
    # and debugging; it reveals internal addresses, so it is off by default.
    expose_upstream_host: bool = False
    # Envoy's own outlier detection on pool clusters (passive health, independent of ours).
    outlier_consecutive_5xx: int = Field(default=3, ge=1)
    outlier_base_ejection_s: float = Field(default=10.0, gt=0)
    outlier_max_ejection_percent: int = Field(default=50, ge=0, le=100)
    max_connections: int = Field(default=10_000, ge=1)
    max_pending_requests: int = Field(default=10_000, ge=1)
    max_requests: int = Field(default=10_000, ge=1)

    @field_validator("extproc_endpoints")
    @classmethod
    def _valid_extproc_endpoints(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            parse_endpoint(item)
        return value

    @field_validator("cluster_header", "endpoint_header")
    @classmethod
    def _lower_header(cls, value: str) -> str:
        if not _HEADER.match(value):
            raise ValueError(f"header name {value!r} must be lowercase letters, digits and '-'")
        return value


class PluginConfig(_Strict):
    """One configured scheduling plugin instance: `type` names a registered plugin factory."""

    name: str
    type: str
    parameters: dict[str, Any] = Field(default_factory=dict)


class PluginRef(_Strict):
    pluginRef: str
    weight: float = Field(default=1.0, ge=0.0)


class ProfileConfig(_Strict):
    """Filters run in order, scorers are summed with their weights, one picker decides."""

    name: str
    plugins: tuple[PluginRef, ...] = Field(min_length=1)


class ScrapeConfig(_Strict):
    """Polling of each vLLM endpoint's /metrics."""

    enabled: bool = True
    interval_ms: int = Field(default=100, ge=10, le=60_000)
    timeout_ms: int = Field(default=500, ge=10, le=60_000)
    # Older metrics are ignored by scorers (they fall back to this process's own in-flight counts).
    stale_after_ms: int = Field(default=1000, ge=50)


class SaturationConfig(_Strict):
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


class SchedulingConfig(_Strict):
    plugins: tuple[PluginConfig, ...] = ()
    profiles: tuple[ProfileConfig, ...] = ()
    scrape: ScrapeConfig = ScrapeConfig()
    placement_sync_ms: int = Field(default=50, ge=0, le=10_000,
                                   description="with limits.store redis: how often service replicas exchange where "
                                               "they placed prompt prefixes (extproc/server/placements.py); 0 = never")

    @model_validator(mode="after")
    def _references(self) -> SchedulingConfig:
        names = [p.name for p in self.plugins]
        duplicates = {n for n in names if names.count(n) > 1}
        if duplicates:
            raise ValueError(f"duplicate plugin name(s): {sorted(duplicates)}")
        profiles = [p.name for p in self.profiles]
        if len(set(profiles)) != len(profiles):
            raise ValueError("duplicate profile name")
        for profile in self.profiles:
            for ref in profile.plugins:
                if ref.pluginRef not in names:
                    raise ValueError(f"profile {profile.name!r} references unknown plugin {ref.pluginRef!r}")
        return self


class TierLimits(_Strict):
    """Limits of one scope (a tenant in total, or a tenant on one model); unset = unlimited."""

    requests_per_s: float | None = Field(default=None, gt=0)
    burst: float | None = Field(default=None, ge=1, description="bucket size; default 2 x requests_per_s")
    concurrency: int | None = Field(default=None, ge=1)
    tokens_per_min: int | None = Field(default=None, ge=1)
    tokens_per_day: int | None = Field(default=None, ge=1)


class TierConfig(_Strict):
    """What every tenant of a tier gets; tenants may override limits in the keys file."""

    # Flow control: the tier's priority class (default: flow_control.default_class), the highest class
    # its requests may ask for with the priority header (default: its own), its fair-share weight.
    priority: str | None = None
    max_priority: str | None = None
    weight: float = Field(default=1.0, gt=0, le=1000)
    # Most output tokens a request of the tier may ask for: higher (or absent) max_tokens is lowered to it
    # in the body vLLM gets, so the reservation of a token budget is the request's true upper bound.
    max_output_tokens: int | None = Field(default=None, ge=1)
    limits: TierLimits = TierLimits()  # the tenant's total over all models
    model_limits: TierLimits = TierLimits()  # the tenant on each model separately


class AuthConfig(_Strict):
    # none: every request is the anonymous tenant of tier `default`; api-key: `Authorization: Bearer`
    # looked up in keys_file; trusted-header: an upstream authenticator sets tenant_header/tier_header.
    mode: Literal["none", "api-key", "trusted-header"] = "none"
    keys_file: str | None = None
    tenant_header: str = "x-tenant-id"
    tier_header: str = "x-tenant-tier"
    reload_interval_s: float = Field(default=2.0, gt=0)

    @model_validator(mode="after")
    def _needs_file(self) -> AuthConfig:
        if self.mode == "api-key" and not self.keys_file:
            raise ValueError("auth.mode api-key needs auth.keys_file")
        return self


class LimitsConfig(_Strict):
    store: Literal["memory", "redis"] = "memory"
    redis_url: str | None = Field(default=None, description="redis:// or rediss://; env EXTPROC_REDIS_URL wins")
    on_store_failure: Literal["fail-open", "fail-closed"] = "fail-open"
    decision_deadline_ms: float = Field(default=5.0, gt=0, le=1000)
    # Expected completion when a request sets no max_tokens: reserved, then corrected to real usage.
    default_output_tokens: int = Field(default=256, ge=1)
    # Prompt estimates (characters / 4) corrected per pool by a fit against the engines' usage.prompt_tokens
    # from the access log (extproc/gateway/calibration.py); false = the raw estimate.
    calibrate_prompt_tokens: bool = True
    lease_ttl_s: float = Field(default=900.0, gt=0, description="a replica's leases expire if it dies")
    # Redis: admit without waiting for the store while its last reply (at most optimistic_max_age_ms
    # old) left room for the request within this replica's share; near a limit, wait for Redis.
    optimistic_admission: bool = True
    optimistic_max_age_ms: float = Field(default=500.0, gt=0, le=60_000)
    # Service replicas sharing the store (their share of a limit when deciding alone: fail-open and
    # optimistic admission); default the number of envoy.extproc_endpoints (at least 1).
    replicas: int | None = Field(default=None, ge=1, le=10_000)

    @model_validator(mode="after")
    def _redis_url(self) -> LimitsConfig:
        if self.redis_url is not None and not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("limits.redis_url must start with redis://, rediss:// or unix://")
        return self


class AuditConfig(_Strict):
    """One JSON line per request written by Envoy (file access log): who (tenant, key label), what (model,
    pool, endpoint), outcome (status, details, tokens, timings). Keys themselves never appear."""

    # "" = off; /dev/stdout for container logs; a file is reopened on SIGUSR1 to Envoy (logrotate).
    path: str = ""


# Profiles every service knows without configuration (see extproc/scheduling/profiles.py).
BUILTIN_PROFILES = ("default", "load-only", "least-inflight", "random")


class HealthPolicy(_Strict):
    """Our own passive health (circuit breaker per endpoint) and active check (metrics scrapes)."""

    consecutive_failures: int = Field(default=3, ge=1, description="5xx / resets in a row that eject")
    base_ejection_s: float = Field(default=5.0, gt=0, description="first ejection; doubles on each repeat")
    max_ejection_s: float = Field(default=60.0, gt=0)
    max_ejected_percent: float = Field(default=50.0, ge=0, le=100, description="of a pool, by passive ejection")
    scrape_failures: int = Field(default=3, ge=1, description="failed scrapes in a row = unavailable")


class DnsDiscovery(_Strict):
    """Endpoints from DNS A/AAAA records, e.g. a Kubernetes headless Service, re-resolved on an interval.

    Envoy resolves the same name itself (a STRICT_DNS cluster), so both see the same endpoints.
    """

    dns: str = Field(min_length=1, max_length=253)
    port: Port
    interval_s: float = Field(default=5.0, ge=0.5, le=3600)
    family: Literal["any", "v4", "v6"] = "any"


class PoolConfig(_Strict):
    """A set of vLLM endpoints serving one model; becomes one Envoy cluster of the same name."""

    name: str
    model: str = Field(description="model name the vLLM servers of this pool serve")
    aliases: tuple[str, ...] = ()
    endpoints: tuple[str, ...] = ()
    discovery: DnsDiscovery | None = None
    fallbacks: int = Field(default=2, ge=0, le=16, description="extra endpoints listed after the pick")
    profile: str = Field(default="default", description="scheduling profile that picks endpoints in this pool")
    lora_adapters: tuple[str, ...] = Field(default=(), description="LoRA adapter names served by this pool")
    backup_pool: str | None = Field(default=None, description="pool that serves when this one has no healthy endpoint")
    max_num_seqs: int | None = Field(default=None, ge=1, le=100_000,
                                     description="the engines' --max-num-seqs: at most this many requests per endpoint "
                                                 "before flow control holds them (default: learned from the engines)")

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"pool name {value!r} must match {_NAME.pattern} (it becomes a cluster name)")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> PoolConfig:
        if bool(self.endpoints) == (self.discovery is not None):
            raise ValueError(f"pool {self.name!r} needs either endpoints or discovery (exactly one)")
        return self

    @field_validator("endpoints")
    @classmethod
    def _valid_endpoints(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            parse_endpoint(item)
        if len(set(value)) != len(value):
            raise ValueError("duplicate endpoint in pool")
        return value


class Policy(_Strict):
    """The whole policy file."""

    def _longest_decision_s(self) -> float:
        """The longest a request may wait for its ext_proc decision (queued + the reply's timeout)."""
        longest = self.flow_control.longest_wait_s() if self.flow_control.enabled else 0.0
        return longest + self.envoy.message_timeout_ms / 1000

    def request_timeout_s(self) -> float:
        """envoy.request_timeout_s, or its default: 60 s, more if a decision may take longer (+30 s)."""
        timeout = self.envoy.request_timeout_s
        return timeout if timeout is not None else max(60.0, self._longest_decision_s() + 30.0)

    service: ServiceConfig = ServiceConfig()
    bounds: BoundsConfig = BoundsConfig()
    envoy: EnvoyConfig = EnvoyConfig()
    scheduling: SchedulingConfig = SchedulingConfig()
    auth: AuthConfig = AuthConfig()
    limits: LimitsConfig = LimitsConfig()
    health: HealthPolicy = HealthPolicy()
    rollout: RolloutPolicy = RolloutPolicy()
    flow_control: FlowControlConfig = FlowControlConfig()
    saturation: SaturationConfig = SaturationConfig()
    audit: AuditConfig = AuditConfig()
    guard: GuardConfig = GuardConfig()
    tiers: dict[str, TierConfig] = Field(default_factory=lambda: {"default": TierConfig()})
    pools: tuple[PoolConfig, ...] = Field(min_length=1)

    def exchanges_in_flight(self) -> bool:
        """Whether the service replicas exchange their in-flight counts through Redis (extproc.server.fleet)."""
        return self.limits.store == "redis" and self.flow_control.enabled and self.flow_control.fleet_sync_ms > 0

    def shares_placements(self) -> bool:
        """Whether the service replicas exchange where they placed prompt prefixes (extproc.server.placements)."""
        return self.limits.store == "redis" and self.scheduling.placement_sync_ms > 0

    def unshared_replicas(self) -> int:
        """Service replicas that each place prompt prefixes without telling the others: 1 when this one is alone
        or when placements are shared through Redis."""
        if self.shares_placements():
            return 1
        return max(1, self.limits.replicas or len(self.envoy.extproc_endpoints))

    @model_validator(mode="after")
    def _unique_names(self) -> Policy:
        seen_pools: set[str] = set()
        seen_models: dict[str, str] = {}
        for pool in self.pools:
            if pool.name in seen_pools:
                raise ValueError(f"duplicate pool name {pool.name!r}")
            seen_pools.add(pool.name)
            for name in (pool.model, *pool.aliases, *pool.lora_adapters):
                other = seen_models.get(name)
                if other is not None and other != pool.name:
                    raise ValueError(f"model name {name!r} is claimed by pools {other!r} and {pool.name!r}")
                seen_models[name] = pool.name
        names = {p.name for p in self.pools}
        problems = check_splits(self.rollout, {p.name: p for p in self.pools}, self.tiers)
        if problems:
            raise ValueError("; ".join(problems))
        if self.rollout.fallback_route_file is not None and not self.envoy.failure_mode_allow:
            raise ValueError("rollout.fallback_route_file routes requests the service did not route: it needs "
                             "envoy.failure_mode_allow: true (fail closed answers them 500)")
        if self.envoy.failure_mode_allow and self.envoy.fallback_pool not in names:
            raise ValueError("envoy.failure_mode_allow needs envoy.fallback_pool naming a pool (where requests go "
                             "when the service is bypassed)")
        for pool in self.pools:
            if pool.backup_pool is not None and (pool.backup_pool not in names or pool.backup_pool == pool.name):
                raise ValueError(f"pool {pool.name!r}: backup_pool {pool.backup_pool!r} must be another pool")
        timeout = self.envoy.request_timeout_s
        if timeout and timeout <= self._longest_decision_s():
            raise ValueError(f"envoy.request_timeout_s ({timeout:g}) must exceed the longest flow_control wait plus "
                             f"envoy.message_timeout_ms ({self._longest_decision_s():g} s), or be 0")
        if "default" not in self.tiers:
            raise ValueError("tiers must define 'default' (the tier of tenants that name none)")
        unknown_tiers = sorted(set(self.guard.tiers) - set(self.tiers))
        if unknown_tiers:
            raise ValueError(f"guard.tiers names unknown tiers {unknown_tiers} (tiers: {sorted(self.tiers)})")
        classes = self.flow_control.classes
        for name, tier in self.tiers.items():
            for field_name in ("priority", "max_priority"):
                value = getattr(tier, field_name)
                if value is not None and value not in classes:
                    raise ValueError(f"tiers.{name}.{field_name}: {value!r} is not a flow_control class "
                                     f"(classes: {sorted(classes)})")
        known = set(BUILTIN_PROFILES) | {p.name for p in self.scheduling.profiles}
        for pool in self.pools:
            if pool.profile not in known:
                raise ValueError(f"pool {pool.name!r}: unknown scheduling profile {pool.profile!r} "
                                 f"(known: {sorted(known)})")
        return self
