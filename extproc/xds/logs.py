"""What Envoy reports: usage tokens into dynamic metadata, the gRPC access log to our service, the audit
file log; and the rate-limit response headers Envoy adds from our dynamic metadata (extproc/xds/render.py)."""

from __future__ import annotations

from typing import Any

from extproc.config import Policy
from extproc.config.secrets import GRPC_TOKEN_METADATA, read_secret
from extproc.openai.apis import RATELIMIT_HEADERS

__all__ = ["AUDIT_FORMAT", "EXTPROC_CLUSTER", "OTEL_CLUSTER", "USAGE_NAMESPACE", "access_log", "envoy_tracing",
           "extproc_grpc_service", "otel_cluster", "ratelimit_response_headers", "usage_filters"]

EXTPROC_CLUSTER = "extproc"
OTEL_CLUSTER = "otel_collector"
_T = "type.googleapis.com/envoy."


def extproc_grpc_service(policy: Policy) -> dict[str, Any]:
    """Envoy's gRPC service for ext_proc and the access log: our cluster, plus the shared token when
    `service.grpc_token_file` is set (read here, at render time)."""
    service: dict[str, Any] = {"envoy_grpc": {"cluster_name": EXTPROC_CLUSTER}}
    token = read_secret(policy.service.grpc_token_file)
    if token is not None:
        service["initial_metadata"] = [{"key": GRPC_TOKEN_METADATA, "value": token}]
    return service


USAGE_NAMESPACE = "extproc.usage"


def ratelimit_response_headers() -> list[dict[str, Any]]:
    """Response mutations of the header_mutation filter: each rate-limit header from our dynamic metadata
    (`extproc:<header name>`, set with the route when the tenant has limits), so no response-headers message
    goes to the service. Absent (no limits, an unrouted or refused request) the value formats empty and Envoy
    adds nothing (`keep_empty_value` false); present it replaces any upstream copy. Our own 429s carry the
    headers in the immediate response. Clients cannot write the `extproc` namespace: only ext_proc can."""
    return [{"append": {"header": {"key": name, "value": f"%DYNAMIC_METADATA(extproc:{name})%"},
                        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}} for name in RATELIMIT_HEADERS]


# Where each response shape reports its tokens -> the key of `extproc.usage` they go to. One response has one
# shape, so the rules never compete: OpenAI's `usage.prompt_tokens` (chat, completions, embeddings; the last
# chunk of a stream); Anthropic's and Responses' `usage.input_tokens` (a JSON body, and Anthropic's final
# `message_delta` event, which vLLM sends with both counts); a streamed Response's `response.completed` event.
_USAGE_PATHS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("usage", "prompt_tokens"), "prompt_tokens"),
    (("usage", "completion_tokens"), "completion_tokens"),
    (("usage", "input_tokens"), "prompt_tokens"),
    (("usage", "output_tokens"), "completion_tokens"),
)
_STREAM_ONLY_PATHS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("response", "usage", "input_tokens"), "prompt_tokens"),
    (("response", "usage", "output_tokens"), "completion_tokens"),
)


def _usage_rules(stream: bool = False) -> list[dict[str, Any]]:
    """Usage tokens -> dynamic metadata `extproc.usage` (prompt_tokens, completion_tokens)."""
    paths = _USAGE_PATHS + (_STREAM_ONLY_PATHS if stream else ())
    return [
        {"selectors": [{"key": key} for key in path],
         "on_present": {"metadata_namespace": USAGE_NAMESPACE, "key": target, "type": "NUMBER"}}
        for path, target in paths
    ]


def usage_filters() -> list[dict[str, Any]]:
    """Envoy-native usage extraction: no response byte passes through Python."""
    return [
        {
            "name": "envoy.filters.http.json_to_metadata",
            "typed_config": {
                "@type": _T + "extensions.filters.http.json_to_metadata.v3.JsonToMetadata",
                # Any JSON media type, charset parameter or not (vLLM sends plain application/json).
                "response_rules": {"rules": _usage_rules(), "allow_content_types_regex": {
                    "google_re2": {}, "regex": "application/json(;.*)?"}},
            },
        },
        {
            # Work in progress upstream (Envoy 1.40): if absent, streamed usage is charged as estimated.
            "name": "envoy.filters.http.sse_to_metadata",
            "typed_config": {
                "@type": _T + "extensions.filters.http.sse_to_metadata.v3.SseToMetadata",
                "response_rules": {"content_parser": {
                    "name": "envoy.content_parsers.json",
                    "typed_config": {
                        "@type": _T + "extensions.content_parsers.json.v3.JsonContentParser",
                        "rules": [{"rule": rule} for rule in _usage_rules(stream=True)],
                    },
                }},
            },
        },
    ]


# The audit line: field -> Envoy command operator (json_format keeps numbers numbers; absent = null).
AUDIT_FORMAT = {
    "time": "%START_TIME%",
    # Our own id (never the client's): the key of the request's leases and reservation.
    "request_id": "%DYNAMIC_METADATA(extproc:request_id)%",
    # The client's x-request-id as sent: untrusted, a correlation hint only.
    "client_request_id": "%REQ(X-REQUEST-ID)%",
    "tenant": "%DYNAMIC_METADATA(extproc:tenant)%",
    "key": "%DYNAMIC_METADATA(extproc:key)%",
    "model": "%DYNAMIC_METADATA(extproc:model)%",
    "pool": "%DYNAMIC_METADATA(extproc:pool)%",
    "endpoint": "%UPSTREAM_HOST%",
    "status": "%RESPONSE_CODE%",
    "details": "%RESPONSE_CODE_DETAILS%",
    "flags": "%RESPONSE_FLAGS%",
    "prompt_tokens": "%DYNAMIC_METADATA(extproc.usage:prompt_tokens)%",
    "completion_tokens": "%DYNAMIC_METADATA(extproc.usage:completion_tokens)%",
    "duration_ms": "%DURATION%",
    "upstream_first_byte_ms": "%RESPONSE_DURATION%",
    "client": "%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%",
    "method": "%REQ(:METHOD)%",
    "path": "%REQ(:PATH)%",
    "user_agent": "%REQ(USER-AGENT)%",
}


def access_log(policy: Policy) -> list[dict[str, Any]]:
    """gRPC access log to our service (final status, upstream host, usage and our reservation), and the
    audit file log when `audit.path` is set."""
    logs: list[dict[str, Any]] = [{
        "name": "envoy.access_loggers.http_grpc",
        "typed_config": {
            "@type": _T + "extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig",
            "common_config": {
                "log_name": "extproc",
                "transport_api_version": "V3",
                "grpc_service": extproc_grpc_service(policy),
                "buffer_flush_interval": "0.1s",
                "buffer_size_bytes": 16384,
            },
        },
    }]
    if policy.audit.path:
        logs.append({
            "name": "envoy.access_loggers.file",
            "typed_config": {
                "@type": _T + "extensions.access_loggers.file.v3.FileAccessLog",
                "path": policy.audit.path,
                "log_format": {"json_format": AUDIT_FORMAT},
            },
        })
    return logs


def envoy_tracing(policy: Policy) -> dict[str, Any] | None:
    """Envoy's own OpenTelemetry tracer (policy `tracing` with `envoy: true`): its spans go to the same
    collector at the same ratio; it passes its trace context to the engine and, on the ext_proc stream's gRPC
    metadata, to our service, whose decision span joins the trace."""
    tracing = policy.tracing
    if not (tracing.enabled and tracing.envoy):
        return None
    return {
        "random_sampling": {"value": tracing.sample_ratio * 100},
        "provider": {"name": "envoy.tracers.opentelemetry", "typed_config": {
            "@type": _T + "config.trace.v3.OpenTelemetryConfig",
            "grpc_service": {"envoy_grpc": {"cluster_name": OTEL_CLUSTER}, "timeout": "1s"},
            "service_name": "envoy",
        }},
    }


def otel_cluster(policy: Policy) -> dict[str, Any] | None:
    """The OTLP/gRPC collector's cluster, when Envoy traces."""
    if envoy_tracing(policy) is None:
        return None
    host, _, port = policy.tracing.otlp_endpoint.rpartition(":")
    return {
        "@type": _T + "config.cluster.v3.Cluster",
        "name": OTEL_CLUSTER,
        "type": "STRICT_DNS",
        "connect_timeout": "1s",
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": _T + "extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}},
        }},
        "load_assignment": {"cluster_name": OTEL_CLUSTER, "endpoints": [{"lb_endpoints": [{"endpoint": {
            "address": {"socket_address": {"address": host.strip("[]"), "port_value": int(port)}}}}]}]},
    }
