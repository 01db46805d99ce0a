"""Envoy as the gateways of the Gateway API Inference Extension configure it around an endpoint picker (our service in
`mode: endpoint-picker`), written from their published sources (the YAML is ours):

- **istio**: Istio's InferencePool support. The HTTP connection manager carries an ext_proc filter (istio/istio
  pilot/pkg/xds/filters/filters.go, `InferencePoolExtProc`: failure_mode_allow, message_timeout 1000 s, metadata
  received from and forwarded to the `envoy.lb` namespace only); the route to the pool overrides it per route
  (pilot/pkg/networking/core/route/route.go: the picker's cluster, request and response bodies
  FULL_DUPLEX_STREAMED, trailers SEND); the pool's cluster balances with `override_host` reading the pick from
  metadata `envoy.lb` / `x-gateway-destination-endpoint` and writing the host it chose to
  `envoy.lb` / `x-gateway-destination-endpoint-served`, round robin as fallback
  (pilot/pkg/networking/core/cluster_builder.go).
- **ai-gateway**: Envoy AI Gateway (envoyproxy/ai-gateway internal/extensionserver/inferencepool.go: ext_proc with
  FULL_DUPLEX_STREAMED bodies, trailers SEND, message_timeout 300 s, fail closed; the picker's cluster STRICT_DNS,
  HTTP/2 over TLS accepting the picker's certificate; post_cluster_modify.go: the pool is an ORIGINAL_DST cluster
  routing by the `x-gateway-destination-endpoint` header, one `ip:port`; post_route_modify.go: no host rewrite).

Where a control plane would use EDS or the mesh's mTLS, these use STATIC endpoints and plaintext, so one Envoy
runs them on 127.0.0.1. `extproc envoy render` writes the istio shape for a policy in endpoint-picker mode; the
tests and `extproc bench overhead --body-modes` run both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from extproc.config import Policy
from extproc.config.epp import DESTINATION_ENDPOINT, DESTINATION_ENDPOINT_SERVED, DESTINATION_ENDPOINT_SUBSET
from extproc.config.schema import parse_endpoint

__all__ = ["BODY_MODES", "Shape", "picker_bootstrap", "picker_static"]

Shape = Literal["istio", "ai-gateway"]
_T = "type.googleapis.com/envoy."
BODY_MODES = {"buffered": "BUFFERED", "streamed": "STREAMED", "full-duplex": "FULL_DUPLEX_STREAMED"}
PICKER_CLUSTER = "outbound|9002||endpoint-picker.llm.svc.cluster.local"  # Istio's name for the picker's Service
POOL_CLUSTER = "outbound|54321||pool-ip-0.llm.svc.cluster.local"  # Istio's shadow Service of the InferencePool


def _address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _endpoints(addresses: Sequence[str]) -> list[dict[str, Any]]:
    return [{"endpoint": {"address": _address(*parse_endpoint(a))}} for a in addresses]


def _processing_mode(body_mode: str) -> dict[str, str]:
    mode = BODY_MODES[body_mode]
    # Full duplex needs the trailers too (Envoy refuses the filter otherwise); STREAMED and BUFFERED do not.
    trailers = "SEND" if mode == "FULL_DUPLEX_STREAMED" else "SKIP"
    return {"request_header_mode": "SEND", "request_body_mode": mode, "request_trailer_mode": trailers,
            "response_header_mode": "SEND", "response_body_mode": mode, "response_trailer_mode": trailers}


def _picker_cluster(name: str, address: tuple[str, int], tls: bool, strict_dns: bool) -> dict[str, Any]:
    cluster: dict[str, Any] = {
        "name": name,
        "type": "STRICT_DNS" if strict_dns else "STATIC",
        "connect_timeout": "10s" if strict_dns else "1s",
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": _T + "extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}},
        }},
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": _address(*address)}}]}]},
    }
    if strict_dns:
        cluster["lb_policy"] = "LEAST_REQUEST"
    if tls:  # as Envoy AI Gateway: TLS, any certificate accepted (an empty validation context)
        cluster["transport_socket"] = {"name": "envoy.transport_sockets.tls", "typed_config": {
            "@type": _T + "extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "common_tls_context": {"validation_context": {}}}}
    return cluster


def _subset_from_header(header: str) -> dict[str, Any]:
    """A gateway that tells the picker a subset: the request header's value (comma-separated `ip:port`s) into
    metadata `envoy.lb.subset_hint`, the way declarative gateway filters set it (header_to_metadata)."""
    return {"name": "envoy.filters.http.header_to_metadata", "typed_config": {
        "@type": _T + "extensions.filters.http.header_to_metadata.v3.Config",
        "request_rules": [{"header": header, "remove": True, "on_header_present": {
            "metadata_namespace": "envoy.lb.subset_hint", "key": DESTINATION_ENDPOINT_SUBSET, "type": "STRING"}}],
    }}


def picker_bootstrap(policy: Policy, shape: Shape, picker: tuple[str, int], pool_endpoints: Sequence[str], *,
                     body_mode: str = "full-duplex", picker_tls: bool = False, subset_header: str | None = None,
                     upstream_host_header: bool = False) -> dict[str, Any]:
    """A static bootstrap: listener `envoy.listen_port` -> ext_proc (the picker at `picker`) -> the pool.
    `subset_header`: a request header the gateway turns into the subset hint (forwarded to the picker).
    `upstream_host_header`: responses name the endpoint that served (`x-gateway-upstream-host`), for tests."""
    envoy = policy.envoy
    router = {"name": "envoy.filters.http.router",
              "typed_config": {"@type": _T + "extensions.filters.http.router.v3.Router"}}
    route: dict[str, Any] = {"name": "llm", "match": {"prefix": "/"},
                             "route": {"cluster": POOL_CLUSTER, "timeout": f"{envoy.route_timeout_s:g}s"}}
    forwarded = ["envoy.lb"] + (["envoy.lb.subset_hint"] if subset_header else [])
    if shape == "istio":
        picker_name = PICKER_CLUSTER
        ext_proc = {
            "@type": _T + "extensions.filters.http.ext_proc.v3.ExternalProcessor",
            "grpc_service": {"envoy_grpc": {"cluster_name": "dummy"}, "timeout": "10s"},
            "failure_mode_allow": True,
            "processing_mode": {"request_header_mode": "SKIP", "response_header_mode": "SKIP"},
            "message_timeout": "1000s",
            "metadata_options": {"receiving_namespaces": {"untyped": ["envoy.lb"]},
                                 "forwarding_namespaces": {"untyped": forwarded}},
        }
        route["typed_per_filter_config"] = {"envoy.filters.http.ext_proc": {
            "@type": _T + "extensions.filters.http.ext_proc.v3.ExtProcPerRoute",
            "overrides": {"failure_mode_allow": False,  # the InferencePool's failureMode: FailClose
                          "grpc_service": {"envoy_grpc": {"cluster_name": picker_name}},
                          "processing_mode": _processing_mode(body_mode)}}}
        pool = {
            "name": POOL_CLUSTER, "type": "STATIC", "connect_timeout": "10s", "lb_policy": "CLUSTER_PROVIDED",
            "load_balancing_policy": {"policies": [{"typed_extension_config": {
                "name": "envoy.load_balancing_policies.override_host",
                "typed_config": {
                    "@type": _T + "extensions.load_balancing_policies.override_host.v3.OverrideHost",
                    "override_host_sources": [{"metadata": {"key": "envoy.lb",
                                                            "path": [{"key": DESTINATION_ENDPOINT}]}}],
                    "selected_host_key": {"key": "envoy.lb", "path": [{"key": DESTINATION_ENDPOINT_SERVED}]},
                    "fallback_policy": {"policies": [{"typed_extension_config": {
                        "name": "envoy.load_balancing_policies.round_robin",
                        "typed_config": {"@type": _T + "extensions.load_balancing_policies.round_robin.v3.RoundRobin"},
                    }}]},
                }}}]},
            "load_assignment": {"cluster_name": POOL_CLUSTER,
                                "endpoints": [{"lb_endpoints": _endpoints(pool_endpoints)}]},
        }
    else:
        picker_name = "envoyextensionpolicy/llm/inferencepool-llama/extproc/0"
        ext_proc = {
            "@type": _T + "extensions.filters.http.ext_proc.v3.ExternalProcessor",
            "grpc_service": {"envoy_grpc": {"cluster_name": picker_name,
                                            "authority": f"endpoint-picker.llm:{picker[1]}"}},
            "processing_mode": _processing_mode(body_mode),
            "allow_mode_override": False,
            "message_timeout": "300s",
            "failure_mode_allow": False,
        }
        if subset_header:
            ext_proc["metadata_options"] = {"forwarding_namespaces": {"untyped": forwarded}}
        route["route"]["auto_host_rewrite"] = False
        pool = {
            "name": POOL_CLUSTER, "type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED", "connect_timeout": "10s",
            "original_dst_lb_config": {"use_http_header": True, "http_header_name": DESTINATION_ENDPOINT},
        }
    if upstream_host_header:
        route["response_headers_to_add"] = [{"header": {"key": "x-gateway-upstream-host",
                                                        "value": "%UPSTREAM_REMOTE_ADDRESS%"},
                                             "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}]
    if body_mode == "streamed":  # the body must reach the picker before its headers reply: the route waits for it
        ext_proc["send_body_without_waiting_for_header_response"] = True
    filters = ([_subset_from_header(subset_header)] if subset_header else []) + [
        {"name": "envoy.filters.http.ext_proc", "typed_config": ext_proc}, router]
    hcm = {
        "@type": _T + "extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "inference", "codec_type": "AUTO",
        "route_config": {"name": "llm", "virtual_hosts": [{"name": "llm", "domains": ["*"], "routes": [route]}]},
        "http_filters": filters,
    }
    listener = {"name": "inference", "address": _address(envoy.listen_host, envoy.listen_port),
                "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                "typed_config": hcm}]}]}
    clusters = [pool, _picker_cluster(picker_name, picker, picker_tls, strict_dns=shape == "ai-gateway")]
    return {"node": {"id": f"inference-{shape}", "cluster": "inference"},
            "admin": {"address": _address("127.0.0.1", envoy.admin_port)},
            "static_resources": {"listeners": [listener], "clusters": clusters}}


def picker_static(policy: Policy) -> dict[str, Any]:
    """Endpoint-picker mode: an Envoy shaped like Istio's InferencePool support around this service
    (extproc/xds/picker.py), the pool's endpoints from the policy."""
    pool = policy.pools[0]
    if not pool.endpoints:
        raise ValueError(f"pool {pool.name!r} takes its endpoints from DNS or an InferencePool: in endpoint-picker "
                         f"mode the gateway (Istio, kgateway, Envoy AI Gateway) renders Envoy's configuration")
    service = policy.service
    host, port = (parse_endpoint(policy.envoy.extproc_endpoints[0]) if policy.envoy.extproc_endpoints
                  else (service.grpc_host if service.grpc_host != "0.0.0.0" else "127.0.0.1", service.grpc_port))
    return picker_bootstrap(policy, "istio", (host, port), pool.endpoints, body_mode=policy.envoy.request_body_mode,
                            picker_tls=service.tls is not None,
                            upstream_host_header=policy.envoy.expose_upstream_host)
