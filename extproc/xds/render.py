"""Render Envoy's bootstrap and file-based xDS (LDS, RDS, CDS, one EDS per pool) from a policy.

Pools and clusters come from one source, so they can never disagree. Files are written with an
atomic rename into a directory Envoy watches, so Envoy never reads a half-written file.

The decision survives the service: ext_proc fails open (`failure_mode_allow: true`), so an exchange whose
routing decision was made runs to its end even if our service dies or stalls afterwards (measured with
Envoy 1.40: without it a broken ext_proc stream cut a running SSE stream and answered 500 to a routed
JSON request). What keeps every other request from reaching a model is the route table: only requests
carrying the pool header, which only our service sets (clients' copies are stripped before the route is
chosen), take the pool route; the rest get the unrouted route: a 500 (fail closed) or the fallback pool
(`envoy.failure_mode_allow: true`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from extproc.config import EnvoyConfig, Policy, PoolConfig
from extproc.config.schema import parse_endpoint
from extproc.xds.ext_proc import buffer_filter, ext_proc_filter, request_buffer_bytes
from extproc.xds.local_reply import local_reply_config, unrouted_response
from extproc.xds.logs import (
    AUDIT_FORMAT,
    EXTPROC_CLUSTER,
    USAGE_NAMESPACE,
    access_log,
    envoy_tracing,
    otel_cluster,
    ratelimit_response_headers,
    usage_filters,
)
from extproc.xds.picker import picker_static

__all__ = ["AUDIT_FORMAT", "EXTPROC_CLUSTER", "LISTENER", "ROUTE_CONFIG", "USAGE_NAMESPACE", "access_log", "dump",
           "extproc_cluster", "http_filters", "listener", "render_files", "render_static", "route_config",
           "write_atomic", "write_config"]

ROUTE_CONFIG = "llm_routes"
LISTENER = "llm_listener"
_T = "type.googleapis.com/envoy."

def _seconds(value: float) -> str:
    return f"{value:g}s"


def _file_source(directory: Path, name: str) -> dict[str, Any]:
    return {
        "path_config_source": {"path": str(directory / name), "watched_directory": {"path": str(directory)}},
        "resource_api_version": "V3",
    }


def _address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def stripped_headers(policy: Policy) -> list[str]:
    """Headers only we (or a trusted authenticator) may set; removed from every client request."""
    envoy = policy.envoy
    stripped = [envoy.cluster_header, envoy.endpoint_header]
    if policy.auth.mode != "trusted-header":  # only a trusted upstream authenticator may set these
        stripped += [policy.auth.tenant_header, policy.auth.tier_header]
    return stripped


def early_header_mutation(policy: Policy) -> list[dict[str, Any]]:
    """Strip client routing headers before Envoy selects a route (HTTP filters run after it has)."""
    return [{
        "name": "envoy.http.early_header_mutation.header_mutation",
        "typed_config": {
            "@type": _T + "extensions.http.early_header_mutation.header_mutation.v3.HeaderMutation",
            "mutations": [{"remove": name} for name in stripped_headers(policy)],
        },
    }]


def http_filters(policy: Policy) -> list[dict[str, Any]]:
    strip = [{"remove": name} for name in stripped_headers(policy)]
    return [
        {
            "name": "envoy.filters.http.header_mutation",
            "typed_config": {
                "@type": _T + "extensions.filters.http.header_mutation.v3.HeaderMutation",
                "mutations": {"request_mutations": strip, "response_mutations": ratelimit_response_headers()},
            },
        },
        *buffer_filter(policy),
        ext_proc_filter(policy),
        *usage_filters(),
        {"name": "envoy.filters.http.router",
         "typed_config": {"@type": _T + "extensions.filters.http.router.v3.Router"}},
    ]


def route_config(policy: Policy) -> dict[str, Any]:
    envoy = policy.envoy
    route: dict[str, Any] = {
        "match": {"prefix": "/"},
        "route": {
            "cluster_header": envoy.cluster_header,
            "timeout": _seconds(envoy.route_timeout_s),
            # Retry only before any response byte reached the client (connect failure, refused stream,
            # reset before response headers), on another host: the
            # override_host policy then takes the next endpoint of the destination header.
            "retry_policy": {
                "retry_on": "connect-failure,refused-stream,reset",
                "num_retries": envoy.retries,
                "retry_host_predicate": [{
                    "name": "envoy.retry_host_predicates.previous_hosts",
                    "typed_config": {"@type": _T + "extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"},
                }],
                "host_selection_retry_max_attempts": 5,
                "retry_back_off": {"base_interval": "0.025s", "max_interval": "0.25s"},
            },
        },
    }
    if envoy.expose_upstream_host:
        route["response_headers_to_add"] = [{
            "header": {"key": "x-gateway-upstream-host", "value": "%UPSTREAM_REMOTE_ADDRESS%"},
            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
        }]
    # Only requests our service routed carry the pool header (clients' copies are stripped first);
    # everything else (the service unreachable, slow, or dead before its reply) takes the unrouted route.
    route["match"]["headers"] = [{"name": envoy.cluster_header, "present_match": True}]
    routes = [route]
    if envoy.failure_mode_allow and envoy.fallback_pool is not None:  # fail open: to the fallback pool
        fallback = {key: value for key, value in route.items() if key != "match"}
        fallback["route"] = {k: v for k, v in route["route"].items() if k != "cluster_header"}
        fallback["route"]["cluster"] = next(p.cluster or p.name for p in policy.pools if p.name == envoy.fallback_pool)
        routes.append({"match": {"prefix": "/"}, **fallback})
    else:  # fail closed
        routes.append({"match": {"prefix": "/"}, **unrouted_response()})
    return {
        "@type": _T + "config.route.v3.RouteConfiguration",
        "name": ROUTE_CONFIG,
        "virtual_hosts": [{"name": "llm", "domains": ["*"], "routes": routes}],
    }


def listener(policy: Policy, rds: dict[str, Any]) -> dict[str, Any]:
    envoy = policy.envoy
    hcm: dict[str, Any] = {
        "@type": _T + "extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "llm",
        "codec_type": "AUTO",
        "stream_idle_timeout": _seconds(envoy.stream_idle_timeout_s),
        # Slow loris: headers, then the whole request (upload + admission queue), each within a bound.
        "request_headers_timeout": _seconds(envoy.request_headers_timeout_s),
        "request_timeout": _seconds(policy.request_timeout_s()),
        "local_reply_config": local_reply_config(),
        "access_log": access_log(policy),
        # The route is chosen (and cached) before HTTP filters run: without this, a client's
        # x-gateway-pool would pick the route whenever ext_proc fails open.
        "early_header_mutation_extensions": early_header_mutation(policy),
        "http_filters": http_filters(policy),
        **rds,
    }
    tracing = envoy_tracing(policy)
    if tracing is not None:
        hcm["tracing"] = tracing
    return {
        "@type": _T + "config.listener.v3.Listener",
        "name": LISTENER,
        "address": _address(envoy.listen_host, envoy.listen_port),
        # The request body is buffered for ext_proc: allow the policy's max body plus headroom.
        "per_connection_buffer_limit_bytes": request_buffer_bytes(policy),
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                        "typed_config": hcm}]}],
    }


def load_assignment(pool: PoolConfig) -> dict[str, Any]:
    if pool.discovery is not None:  # Envoy resolves the same name our service does
        endpoints = [{"endpoint": {"address": _address(pool.discovery.dns, pool.discovery.port)}}]
    else:
        endpoints = [{"endpoint": {"address": _address(*parse_endpoint(a))}} for a in pool.endpoints]
    return {
        "@type": _T + "config.endpoint.v3.ClusterLoadAssignment",
        "cluster_name": pool.cluster or pool.name,
        "endpoints": [{"lb_endpoints": endpoints}],
    }


def _pool_cluster(pool: PoolConfig, envoy: EnvoyConfig, eds: dict[str, Any] | None) -> dict[str, Any]:
    cluster: dict[str, Any] = {
        "@type": _T + "config.cluster.v3.Cluster",
        "name": pool.cluster or pool.name,
        "connect_timeout": "1s",
        # Our service names the endpoint in a header; Envoy keeps health, outlier detection and
        # circuit breakers working, and falls back to least_request if the header is missing/unknown.
        "load_balancing_policy": {"policies": [{"typed_extension_config": {
            "name": "envoy.load_balancing_policies.override_host",
            "typed_config": {
                "@type": _T + "extensions.load_balancing_policies.override_host.v3.OverrideHost",
                "override_host_sources": [{"header": envoy.endpoint_header}],
                "fallback_policy": {"policies": [{"typed_extension_config": {
                    "name": "envoy.load_balancing_policies.least_request",
                    "typed_config": {
                        "@type": _T + "extensions.load_balancing_policies.least_request.v3.LeastRequest"},
                }}]},
            },
        }}]},
        "outlier_detection": {
            "consecutive_5xx": envoy.outlier_consecutive_5xx,
            "consecutive_gateway_failure": envoy.outlier_consecutive_5xx,
            "interval": "1s",
            "base_ejection_time": _seconds(envoy.outlier_base_ejection_s),
            "max_ejection_percent": envoy.outlier_max_ejection_percent,
        },
        "circuit_breakers": {"thresholds": [{
            "priority": "DEFAULT",
            "max_connections": envoy.max_connections,
            "max_pending_requests": envoy.max_pending_requests,
            "max_requests": envoy.max_requests,
            "max_retries": 3,
        }]},
    }
    if pool.discovery is not None:
        cluster["type"] = "STRICT_DNS"
        cluster["dns_refresh_rate"] = _seconds(pool.discovery.interval_s)
        cluster["dns_lookup_family"] = {"any": "ALL", "v4": "V4_ONLY", "v6": "V6_ONLY"}[pool.discovery.family]
        assignment = load_assignment(pool)
        assignment.pop("@type")
        cluster["load_assignment"] = assignment
    elif eds is None:
        cluster["type"] = "STATIC"
        assignment = load_assignment(pool)
        assignment.pop("@type")
        cluster["load_assignment"] = assignment
    else:
        cluster["type"] = "EDS"
        cluster["eds_cluster_config"] = {"eds_config": eds}
    return cluster


STREAMS_PER_CONNECTION = 4  # with several service workers (see extproc/server/workers.py)


def extproc_http2_options(workers: int) -> dict[str, Any]:
    """Several workers share the service's port, and one connection reaches one of them: a few streams per
    connection make Envoy open more of them as load grows, which the kernel spreads over the workers."""
    return {"max_concurrent_streams": STREAMS_PER_CONNECTION} if workers > 1 else {}


def extproc_cluster(policy: Policy) -> dict[str, Any]:
    service = policy.service
    addresses = [parse_endpoint(a) for a in policy.envoy.extproc_endpoints] or [(service.grpc_host, service.grpc_port)]
    return {
        "@type": _T + "config.cluster.v3.Cluster",
        "name": EXTPROC_CLUSTER,
        "type": "STATIC",
        "connect_timeout": "0.25s",
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": _T + "extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": extproc_http2_options(service.workers)},
        }},
        "load_assignment": {"cluster_name": EXTPROC_CLUSTER, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": _address(host, port)}} for host, port in addresses]}]},
        "health_checks": [{
            # no_traffic_interval: without it Envoy re-checks an idle cluster only every 60 s, so a drained
            # replica would keep getting streams.
            "timeout": "0.5s", "interval": "1s", "no_traffic_interval": "1s", "unhealthy_threshold": 2,
            "healthy_threshold": 1,
            "grpc_health_check": {"service_name": "envoy.service.ext_proc.v3.ExternalProcessor"},
        }],
    }


def _strip_type(resource: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in resource.items() if k != "@type"}


def render_files(policy: Policy, directory: Path) -> dict[str, dict[str, Any]]:
    """The dynamic (file-xDS) layout: bootstrap.yaml, lds.yaml, rds.yaml, cds.yaml, eds-<pool>.yaml."""
    files: dict[str, dict[str, Any]] = {}
    rds = {"rds": {"route_config_name": ROUTE_CONFIG, "config_source": _file_source(directory, "rds.yaml")}}
    files["lds.yaml"] = {"resources": [listener(policy, rds)]}
    files["rds.yaml"] = {"resources": [route_config(policy)]}
    clusters = [extproc_cluster(policy)]
    if (otel := otel_cluster(policy)) is not None:
        clusters.append(otel)
    for pool in policy.pools:
        if pool.discovery is not None:
            clusters.append(_pool_cluster(pool, policy.envoy, None))
            continue
        name = f"eds-{pool.name}.yaml"
        files[name] = {"resources": [load_assignment(pool)]}
        clusters.append(_pool_cluster(pool, policy.envoy, _file_source(directory, name)))
    files["cds.yaml"] = {"resources": clusters}
    files["bootstrap.yaml"] = {
        "node": {"id": "llm-gateway", "cluster": "llm-gateway"},
        "admin": {"address": _address("127.0.0.1", policy.envoy.admin_port)},
        "dynamic_resources": {
            "lds_config": _file_source(directory, "lds.yaml"),
            "cds_config": _file_source(directory, "cds.yaml"),
        },
        "layered_runtime": {"layers": [{"name": "static", "static_layer": {
            "overload.global_downstream_max_connections": 50000}}]},
    }
    return files


def render_static(policy: Policy) -> dict[str, Any]:
    """The same configuration inlined into one bootstrap (for `envoy --mode validate` and simple runs)."""
    if policy.mode == "endpoint-picker":
        return picker_static(policy)
    hcm_listener = _strip_type(listener(policy, {"route_config": _strip_type(route_config(policy))}))
    clusters = [_strip_type(extproc_cluster(policy))]
    if (otel := otel_cluster(policy)) is not None:
        clusters.append(_strip_type(otel))
    clusters += [_strip_type(_pool_cluster(pool, policy.envoy, None)) for pool in policy.pools]
    return {
        "node": {"id": "llm-gateway", "cluster": "llm-gateway"},
        "admin": {"address": _address("127.0.0.1", policy.envoy.admin_port)},
        "static_resources": {"listeners": [hcm_listener], "clusters": clusters},
    }


def write_atomic(path: Path, content: str) -> None:
    """Write next to the target, then rename over it: Envoy's watcher sees one complete file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(content)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def dump(document: dict[str, Any]) -> str:
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=False)


def write_config(policy: Policy, directory: Path, mount: Path | None = None) -> list[Path]:
    """Write every file; xDS resources first and the bootstrap last, each by atomic rename.

    `mount` is the directory as Envoy will see it (e.g. a ConfigMap mount in a container); by default
    the output directory itself.
    """
    directory = directory.resolve()
    if policy.mode == "endpoint-picker":  # one static bootstrap (the gateway's own xDS serves it in production)
        document = dump(picker_static(policy))
        targets = [directory / "bootstrap.yaml", directory / "static" / "envoy.yaml"]
        for target in targets:
            write_atomic(target, document)
        return targets
    files = render_files(policy, mount or directory)
    written: list[Path] = []
    order = sorted(files, key=lambda n: (n == "bootstrap.yaml", n.startswith(("lds", "cds")), n))
    for name in order:
        target = directory / name
        write_atomic(target, dump(files[name]))
        written.append(target)
    static = directory / "static" / "envoy.yaml"
    write_atomic(static, dump(render_static(policy)))
    written.append(static)
    return written
