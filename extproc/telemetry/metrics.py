"""Prometheus metrics of the gateway, on an injected registry (no global default registry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PHASES = ("request_headers", "request_body", "response_headers", "stream_end", "access_log")
PHASE_CPU = "extproc_phase_cpu_seconds_total"
STREAMS = "extproc_streams_total"
_DECISION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1)
_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class GatewayMetrics:
    """Label values are bounded: models and pools come from config, outcomes from a fixed set."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            "extproc_requests", "Requests decided, by outcome", ["model", "pool", "outcome"], registry=registry
        )
        self.decision_seconds = Histogram(
            "extproc_decision_seconds", "Time to decide a request inside the service",
            buckets=_DECISION_BUCKETS, registry=registry,
        )
        self.duration_seconds = Histogram(
            "extproc_request_duration_seconds", "From request body to end of exchange, per pool",
            ["pool"], buckets=_DURATION_BUCKETS, registry=registry,
        )
        # Envoy's access log times the first upstream byte, i.e. the response headers: for JSON responses
        # that is the whole generation; vLLM sends SSE headers before the first token, so for streams it
        # is the time to admission, not TTFT (the engine's own TTFT histogram is vllm:time_to_first_token).
        self.ttfb_seconds = Histogram(
            "extproc_upstream_ttfb_seconds", "Time to the first upstream response byte (headers), per pool",
            ["pool"], buckets=(0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30), registry=registry,
        )
        # What the gateway adds before the engine sees a request: reading the client's body, the ext_proc
        # exchange (our decision and its queueing in Envoy and this process) and the upstream connection.
        self.upstream_send_seconds = Histogram(
            "extproc_upstream_send_seconds", "From the request's start to its first byte sent upstream, per pool",
            ["pool"], buckets=(0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 1),
            registry=registry,
        )
        self.tpot_seconds = Histogram(
            "extproc_tpot_seconds", "Time per output token, from upstream first/last byte times, per pool",
            ["pool"],
            buckets=(0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5), registry=registry,
        )
        self.upstream_status = Counter(
            "extproc_upstream_responses", "Response status classes seen from upstream, per pool",
            ["pool", "status_class"], registry=registry,
        )
        self.plugin_seconds = Histogram(
            "extproc_scheduler_plugin_seconds", "Time spent in each scheduling plugin", ["plugin"],
            buckets=(0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.001, 0.005), registry=registry,
        )
        self.guard_matches = Counter(
            "extproc_guard_matches", "Content guard matches, by rule and action (deny: requests, mask: matches)",
            ["rule", "action"], registry=registry,
        )
        self.rate_limited = Counter(
            "extproc_rate_limited", "Requests refused by a limit, by dimension", ["limit"], registry=registry
        )
        self.usage_tokens = Counter(
            "extproc_usage_tokens", "Tokens reported by upstream usage, per pool and kind", ["pool", "kind"],
            registry=registry,
        )
        self.usage_missing = Counter(
            "extproc_usage_missing", "Finished requests without usage (charged the estimate), per pool", ["pool"],
            registry=registry,
        )
        self.store_failures = Counter(
            "extproc_limits_store_failures", "Limit store calls that failed or missed their deadline", ["op"],
            registry=registry,
        )
        self.ejections = Counter("extproc_endpoint_ejections", "Endpoints ejected by our circuit breakers, per pool",
                                 ["pool"], registry=registry)
        self.store_up = Gauge("extproc_limits_store_up", "1 while the shared limit store (Redis) answers in time",
                              registry=registry)
        self.store_degraded_admits = Gauge(
            "extproc_limits_degraded_admits", "Admissions decided by the local fallback (fail-open) so far",
            registry=registry)
        self.store_admissions = Gauge(
            "extproc_limits_admissions", "Admissions through the shared store so far, by path: slice (admitted from "
            "this replica's slice of the limits, not waiting) or awaited (decided by the store)", ["path"],
            registry=registry)
        self.store_uncovered = Gauge(
            "extproc_limits_slice_uncovered", "Admissions from a slice the shared store no longer held for this "
            "replica when their recording arrived (expired: a replica stalled or clocks apart) so far",
            registry=registry)
        self.fleet_replicas = Gauge(
            "extproc_flow_fleet_replicas", "Service replicas sharing in-flight counts through Redis (this one "
            "included; flow_control.fleet_sync_ms)", registry=registry)
        self.fleet_sync_failures = Gauge(
            "extproc_flow_fleet_sync_failures", "Failed in-flight exchanges with the other replicas so far",
            registry=registry)
        self.scrapes = Gauge("extproc_endpoint_scrapes", "Endpoint /metrics scrapes this process used, by origin: "
                             "fetched itself (own) or adopted from another replica (shared)", ["origin"],
                             registry=registry)
        self.placement_sync_failures = Gauge(
            "extproc_scheduling_placement_sync_failures", "Failed exchanges of prefix placements with the other "
            "replicas so far (scheduling.placement_sync_ms)", registry=registry)
        self.request_push_failures = Gauge(
            "extproc_scheduling_request_push_failures", "Failed pushes or reads of routed requests between the "
            "replicas so far (scheduling.push_requests)", registry=registry)
        self.store_primary_failures = Gauge(
            "extproc_limits_store_primary_failures", "Shared-store calls that failed or missed the deadline so far",
            registry=registry)
        self.flow_wait_seconds = Histogram(
            "extproc_flow_queue_wait_seconds", "Time requests spent in the admission queue, per priority class",
            ["class"], buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60), registry=registry)
        self.flow_rejected = Counter(
            "extproc_flow_rejected", "Requests shed by flow control, per pool, class and reason "
            "(saturated, queue_full, displaced, timeout)", ["pool", "class", "reason"], registry=registry)
        self.event_loop_lag_seconds = Histogram(
            "extproc_event_loop_lag_seconds", "How late the event loop ran a periodic timer (every 100 ms): what "
            "every callback ready then waited too", buckets=_LAG_BUCKETS, registry=registry)
        self.in_flight = Gauge("extproc_in_flight", "Requests in flight through this process", registry=registry)
        self.config_version = Gauge("extproc_config_version", "Version of the policy snapshot in use",
                                    registry=registry)
        self.config_loads = Counter(
            "extproc_config_loads", "Policy loads by result", ["result"], registry=registry
        )
        # CPU time of the event loop's thread in each phase of our own work, and the ext_proc streams served:
        # per-request CPU by phase = phase / streams (what `extproc bench overhead` reports); the process's
        # total CPU minus these is the gRPC and event-loop machinery.
        self.streams = Counter(STREAMS.removesuffix("_total"), "ext_proc streams (HTTP exchanges) served",
                               registry=registry)
        phase_cpu = Counter(PHASE_CPU.removesuffix("_total"), "CPU seconds of our own work per phase: "
                            "request_headers, request_body, response_headers, stream_end (releasing the exchange), "
                            "access_log (its entry)", ["phase"], registry=registry)
        self.phase_cpu = {phase: phase_cpu.labels(phase) for phase in PHASES}
        self.refused_streams = Counter(
            "extproc_grpc_unauthenticated", "gRPC streams refused for a missing or wrong token, per service",
            ["service"], registry=registry)
