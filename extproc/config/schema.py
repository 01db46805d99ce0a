"""Policy file schema: what an operator writes in YAML, validated strictly.

Every model is frozen, so a loaded policy is an immutable snapshot that can be shared by every
request in flight while a reload builds the next one.
"""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import Field, field_validator, model_validator

from extproc.autoscale.config import AutoscalingConfig
from extproc.config.epp import EndpointPickerConfig, GrpcTls, endpoint_picker_problems, picker_body_mode
from extproc.endpoints.config import (
    DnsDiscovery,
    HealthPolicy,
    InferencePoolSource,
    SaturationConfig,
    ScrapeConfig,
)
from extproc.flow.config import FlowControlConfig
from extproc.guard.config import GuardConfig
from extproc.limits.config import LimitsConfig, RedisTls, TierLimits
from extproc.policy_types import HeaderName, PoolName, Port, Strict
from extproc.rollout.config import RolloutPolicy, check_splits
from extproc.scheduling.config import (
    BUILTIN_PROFILES,
    PluginConfig,
    PluginRef,
    ProfileConfig,
    SchedulingConfig,
)
from extproc.telemetry.tracing_config import TracingConfig

# Every section's model, importable from here (each is defined once, in the package that owns the section).
__all__ = [
    "BUILTIN_PROFILES", "AuditConfig", "AuthConfig", "AutoscalingConfig", "BoundsConfig", "DnsDiscovery",
    "EndpointPickerConfig", "EnvoyConfig", "FlowControlConfig", "GrpcTls", "GuardConfig", "HealthPolicy",
    "InferencePoolSource", "LimitsConfig", "PluginConfig", "PluginRef", "Policy", "PoolConfig", "ProfileConfig",
    "RedisTls", "RolloutPolicy", "SaturationConfig", "SchedulingConfig", "ScrapeConfig", "ServiceConfig",
    "TierConfig", "TierLimits", "parse_endpoint",
]


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


class ServiceConfig(Strict):
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
    # Service processes sharing grpc_port under a supervisor (README "Workers"); read at start. The rendered
    # Envoy config opens one HTTP/2 connection per few streams when it is above 1, so streams spread.
    workers: int = Field(default=1, ge=1, le=64)
    tls: GrpcTls | None = None  # TLS on the gRPC port (extproc/config/epp.py)
    # What serves the gRPC port: lean (HTTP/2 on the event loop, extproc/server/h2/) or grpcio (grpc.aio). The same
    # methods, bounds and answers on both; read at start.
    front_end: Literal["grpcio", "lean"] = "lean"

    @field_validator("grpc_token_file", "admin_token_file")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"{value!r} must be an absolute path (Envoy's renderer reads it too)")
        return value


class BoundsConfig(Strict):
    """Hard limits on what a client may send; over them the request is refused, never crashes us."""

    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    max_json_depth: int = Field(default=32, ge=2, le=256)
    # Element counts, checked before any per-element work (decoding itself is bounded by max_body_bytes).
    max_json_containers: int = Field(default=20_000, ge=16, le=10_000_000)
    max_messages: int = Field(default=2048, ge=1, le=1_000_000)
    max_choices: int = Field(default=128, ge=1, le=100_000, description="n / best_of")
    # Per tenant and process: time its decisions may hold the event loop per second (wall clock, at least their CPU
    # time; a body charged at the headers by its declared length: extproc/gateway/tenant_gate.py), a bucket holding
    # tenant_parse_burst_ms, below envoy.message_timeout_ms; over it its requests get 429 before their bodies are
    # parsed. 0 = no budget.
    tenant_parse_ms_per_s: float = Field(default=500.0, ge=0, le=1000)
    tenant_parse_burst_ms: float = Field(default=250.0, ge=1, le=600_000)
    # CPU time one decision may take (checked between its stages); over it the request gets 413. 0 = none.
    decision_cpu_ms: float = Field(default=250.0, ge=0, le=60_000)


class EnvoyConfig(Strict):
    """Settings for the Envoy files `extproc envoy render` writes."""

    listen_host: str = "127.0.0.1"
    listen_port: Port = 8080
    admin_port: Port = 9901
    # ext_proc service replicas Envoy balances streams over; empty = the one in `service`.
    extproc_endpoints: tuple[str, ...] = ()
    cluster_header: HeaderName = "x-gateway-pool"
    endpoint_header: HeaderName = "x-gateway-destination-endpoint"
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
    # How the rendered ext_proc filter sends request bodies: buffered (the body after the headers reply),
    # prebuffered (Envoy's buffer filter holds the whole body, then headers and body go together: one round trip),
    # streamed (the body right behind the headers; extproc/xds/ext_proc.py) or full-duplex (endpoint-picker mode
    # only).
    request_body_mode: Literal["buffered", "prebuffered", "streamed", "full-duplex"] = "prebuffered"

    @field_validator("extproc_endpoints")
    @classmethod
    def _valid_extproc_endpoints(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            parse_endpoint(item)
        return value


class TierConfig(Strict):
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


class AuthConfig(Strict):
    # none: every request is the anonymous tenant of tier `default`; api-key: `Authorization: Bearer`
    # looked up in keys_file; trusted-header: an upstream authenticator sets tenant_header/tier_header.
    mode: Literal["none", "api-key", "trusted-header"] = "none"
    keys_file: str | None = None
    tenant_header: HeaderName = "x-tenant-id"
    tier_header: HeaderName = "x-tenant-tier"
    reload_interval_s: float = Field(default=2.0, gt=0)

    @model_validator(mode="after")
    def _needs_file(self) -> AuthConfig:
        if self.mode == "api-key" and not self.keys_file:
            raise ValueError("auth.mode api-key needs auth.keys_file")
        return self


class AuditConfig(Strict):
    """One JSON line per request written by Envoy (file access log): who (tenant, key label), what (model,
    pool, endpoint), outcome (status, details, tokens, timings). Keys themselves never appear."""

    # "" = off; /dev/stdout for container logs; a file is reopened on SIGUSR1 to Envoy (logrotate).
    path: str = ""


class PoolConfig(Strict):
    """A set of vLLM endpoints serving one model; becomes one Envoy cluster of the same name."""

    name: PoolName
    model: str = Field(description="model name the vLLM servers of this pool serve")
    aliases: tuple[str, ...] = ()
    endpoints: tuple[str, ...] = ()
    discovery: DnsDiscovery | None = None
    inference_pool: InferencePoolSource | None = None  # endpoints from a watched InferencePool and its pods
    # The Envoy cluster the pool header names (default: the pool's name), e.g. Istio's own cluster of the pool's
    # Service, `outbound|8000||vllm.llm.svc.cluster.local`.
    cluster: str | None = Field(default=None, min_length=1, max_length=255, pattern=r"^[A-Za-z0-9_.|:-]+$")
    fallbacks: int = Field(default=2, ge=0, le=16, description="extra endpoints listed after the pick")
    profile: str = Field(default="default", description="scheduling profile that picks endpoints in this pool")
    lora_adapters: tuple[str, ...] = Field(default=(), description="LoRA adapter names served by this pool")
    backup_pool: str | None = Field(default=None, description="pool that serves when this one has no healthy endpoint")
    max_num_seqs: int | None = Field(default=None, ge=1, le=100_000,
                                     description="the engines' --max-num-seqs: at most this many requests per endpoint "
                                                 "before flow control holds them (default: learned from the engines)")
    image_tokens: int = Field(default=1024, ge=0, le=100_000,
                              description="prompt tokens one image part is estimated to cost on this pool's model")
    audio_tokens: int = Field(default=750, ge=0, le=100_000,
                              description="prompt tokens one audio part is estimated to cost on this pool's model")
    video_tokens: int = Field(default=4096, ge=0, le=1_000_000,
                              description="prompt tokens one video part is estimated to cost on this pool's model")
    cold_start_timeout_s: float = Field(default=0.0, ge=0, le=3600,
                                        description="the pool may have no ready endpoint (scaled to zero): its "
                                                    "requests wait up to this long for the first one (0 = 503 at once)")
    target_per_replica: float | None = Field(default=None, gt=0, le=100_000,
                                             description="autoscaling.target_per_replica for this pool")
    lora_paths: dict[str, str] = Field(default_factory=dict,
                                       description="adapters loaded on demand: name -> the path engines load it "
                                                   "from (each one of lora_adapters)")
    max_adapters_per_endpoint: int = Field(default=4, ge=1, le=1000,
                                           description="adapters loaded on demand per endpoint; beyond it the "
                                                       "least recently used one is unloaded first")
    lora_load_timeout_s: float = Field(default=30.0, gt=0, le=600,
                                       description="how long a request waits for its adapter to be loaded")
    lora_idle_unload_s: float = Field(default=1800.0, ge=0, le=86_400,
                                      description="an adapter loaded on demand that nothing used for this long is "
                                                  "unloaded (0 = never)")
    lora_prewarm: list[str] = Field(default_factory=list, max_length=1000,
                                    description="adapters of lora_paths loaded on every ready endpoint and kept "
                                                "there (never unloaded for idleness or room)")
    sleep_after_idle_s: float = Field(default=0.0, ge=0, le=86_400,
                                      description="engines idle this long are put to sleep (vLLM sleep mode) and "
                                                  "woken when a request needs one (0 = never)")

    @model_validator(mode="after")
    def _one_source(self) -> PoolConfig:
        if bool(self.endpoints) + (self.discovery is not None) + (self.inference_pool is not None) != 1:
            raise ValueError(f"pool {self.name!r} needs endpoints, discovery or inference_pool (exactly one)")
        return self

    @field_validator("endpoints")
    @classmethod
    def _valid_endpoints(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            parse_endpoint(item)
        if len(set(value)) != len(value):
            raise ValueError("duplicate endpoint in pool")
        return value


class Policy(Strict):
    """The whole policy file."""

    def longest_wait_s(self) -> float:
        """The longest a request may be held: its class's wait, a cold pool's start, an adapter's load."""
        waits = [p.lora_load_timeout_s for p in self.pools if p.lora_paths]
        if self.flow_control.enabled:
            waits += [self.flow_control.longest_wait_s(), *(p.cold_start_timeout_s for p in self.pools)]
        return max(waits, default=0.0)

    def _longest_decision_s(self) -> float:
        """The longest a request may wait for its ext_proc decision (queued + the reply's timeout)."""
        return self.longest_wait_s() + self.envoy.message_timeout_ms / 1000

    def request_timeout_s(self) -> float:
        """envoy.request_timeout_s, or its default: 60 s, more if a decision may take longer (+30 s)."""
        timeout = self.envoy.request_timeout_s
        return timeout if timeout is not None else max(60.0, self._longest_decision_s() + 30.0)

    # policy: this service picks the pool and the endpoint; endpoint-picker: the gateway picked the pool (an
    # InferencePool), we pick its endpoint (extproc/config/epp.py).
    mode: Literal["policy", "endpoint-picker"] = "policy"
    endpoint_picker: EndpointPickerConfig = EndpointPickerConfig()
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
    tracing: TracingConfig = TracingConfig()
    autoscaling: AutoscalingConfig = AutoscalingConfig()
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

    _picker_body_mode = model_validator(mode="before")(picker_body_mode)

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
        problems += endpoint_picker_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        if self.rollout.fallback_route_file is not None and not self.envoy.failure_mode_allow:
            raise ValueError("rollout.fallback_route_file routes requests the service did not route: it needs "
                             "envoy.failure_mode_allow: true (fail closed answers them 500)")
        if self.envoy.failure_mode_allow and self.envoy.fallback_pool not in names:
            raise ValueError("envoy.failure_mode_allow needs envoy.fallback_pool naming a pool (where requests go "
                             "when the service is bypassed)")
        for pool in self.pools:
            if pool.cold_start_timeout_s > 0:
                if not self.flow_control.enabled or not self.scheduling.scrape.enabled:
                    raise ValueError(f"pool {pool.name!r}: cold_start_timeout_s holds requests in flow control until "
                                     "a scrape finds an endpoint ready: it needs flow_control.enabled and "
                                     "scheduling.scrape.enabled")
                if pool.backup_pool is not None:
                    raise ValueError(f"pool {pool.name!r}: cold_start_timeout_s (wait for this pool's first "
                                     "endpoint) and backup_pool (send elsewhere at once) exclude each other")
            unknown = sorted(set(pool.lora_paths) - set(pool.lora_adapters))
            if unknown:
                raise ValueError(f"pool {pool.name!r}: lora_paths names adapters not in lora_adapters: {unknown}")
            unknown = sorted(set(pool.lora_prewarm) - set(pool.lora_paths))
            if unknown:
                raise ValueError(f"pool {pool.name!r}: lora_prewarm names adapters not in lora_paths: {unknown}")
            others = set(pool.lora_paths) - set(pool.lora_prewarm)
            if len(set(pool.lora_prewarm)) + (1 if others else 0) > pool.max_adapters_per_endpoint:
                raise ValueError(f"pool {pool.name!r}: lora_prewarm keeps {len(set(pool.lora_prewarm))} adapters "
                                 "loaded; max_adapters_per_endpoint must leave room for one more loaded on demand")
            if pool.sleep_after_idle_s > 0 and pool.cold_start_timeout_s <= 0:
                raise ValueError(f"pool {pool.name!r}: sleep_after_idle_s needs cold_start_timeout_s (how long a "
                                 "request waits while an engine wakes up)")
            if pool.backup_pool is not None and (pool.backup_pool not in names or pool.backup_pool == pool.name):
                raise ValueError(f"pool {pool.name!r}: backup_pool {pool.backup_pool!r} must be another pool")
        budget = self.auth.mode != "none" and self.bounds.tenant_parse_ms_per_s > 0  # named tenants only
        if budget and self.bounds.tenant_parse_burst_ms >= self.envoy.message_timeout_ms:
            raise ValueError("bounds.tenant_parse_burst_ms must be below envoy.message_timeout_ms: one tenant's burst "
                             "holds the others' decisions, which Envoy answers 500 past that timeout")
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
