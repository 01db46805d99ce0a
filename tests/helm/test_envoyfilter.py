"""The EnvoyFilter adds what `extproc envoy render` renders, for the policy in the same release."""

from __future__ import annotations

from typing import Any

import pytest

from extproc.config import Policy, parse_policy
from extproc.xds.logs import OTEL_CLUSTER, envoy_tracing, otel_cluster
from extproc.xds.render import EXTPROC_CLUSTER, access_log, http_filters, render_static, route_config
from tests.helm.chart import (
    FULLNAME,
    NAMESPACE,
    Chart,
    access_logs,
    config_patches,
    find,
    http_filter_patch,
    istio_filter_chain,
    istio_hcm,
    istio_routes,
    policy_text,
)

CUSTOM_POLICY = {
    "bounds": {"max_body_bytes": 1048576},
    "envoy": {
        "cluster_header": "x-llm-pool", "endpoint_header": "x-llm-endpoint", "message_timeout_ms": 250,
        "failure_mode_allow": True, "fallback_pool": "chat", "route_timeout_s": 90, "outlier_consecutive_5xx": 5,
        "outlier_base_ejection_s": 2.5, "outlier_max_ejection_percent": 30, "max_requests": 512,
    },
    "pools": [
        {"name": "chat", "model": "m-chat", "endpoints": ["10.1.0.1:8000", "[fd00::2]:8001"]},
        {"name": "code", "model": "m-code", "endpoints": ["10.1.0.9:9000"], "fallbacks": 0},
    ],
}
POLICIES = {
    "default": {},
    "custom": {"policy": CUSTOM_POLICY},
    "trusted-header": {"policy": {"auth": {"mode": "trusted-header", "tenant_header": "x-team"}}},
    "audit": {"policy": {"audit": {"path": "/dev/stdout"}}},
    # The body right behind the headers (their reply held): trailers keep the stream, uploads may take the
    # request timeout.
    "streamed": {"policy": {"envoy": {"request_body_mode": "streamed"}}},
    "streamed-no-request-timeout": {"policy": {"envoy": {"request_body_mode": "streamed", "request_timeout_s": 0}}},
    # Two round trips to the service (the body after the headers reply), no buffer filter.
    "buffered": {"policy": {"envoy": {"request_body_mode": "buffered"}}},
    "discovery": {"policy": {"pools": [
        {"name": "chat", "model": "m-chat", "discovery": {"dns": "vllm-chat.llm.svc.cluster.local", "port": 8000}},
        {"name": "code", "model": "m-code", "discovery": {"dns": "vllm-code.llm.svc.cluster.local", "port": 8001,
                                                          "interval_s": 2.5, "family": "v4"}},
        {"name": "embed", "model": "m-embed", "endpoints": ["10.1.0.9:9000"]},
    ]}},
    # A pool scaling from zero holds requests longer than any class waits: Envoy's timers follow it.
    "cold-start": {"policy": {"pools": [
        {"name": "chat", "model": "m-chat", "endpoints": ["10.1.0.1:8000"], "cold_start_timeout_s": 95},
        {"name": "code", "model": "m-code", "endpoints": ["10.1.0.9:9000"]},
    ]}},
    # Adapters loaded on demand, without flow control: their wait alone sets Envoy's timers.
    "lora-on-demand": {"policy": {"flow_control": {"enabled": False}, "pools": [
        {"name": "chat", "model": "m-chat", "endpoints": ["10.1.0.1:8000"], "lora_adapters": ["fr"],
         "lora_paths": {"fr": "/adapters/fr"}, "lora_load_timeout_s": 75},
    ]}},
}
CONTEXT = {"istio-gateway": "GATEWAY", "istio-sidecar": "SIDECAR_OUTBOUND"}
# Each pool's ClusterIP Service, whose Istio cluster gets the override_host policy (istio.routing.poolClusters mesh).
SERVICES = {
    "custom": {"chat": "vllm-chat.llm.svc.cluster.local:8000", "code": "vllm-code.llm.svc.cluster.local:9000"},
    "discovery": {"chat": "vllm-chat.llm.svc.cluster.local:8000", "code": "vllm-code.llm.svc.cluster.local:8001",
                  "embed": "vllm-embed.llm.svc.cluster.local:9000"},
    "cold-start": {"chat": "vllm-chat.llm.svc.cluster.local:8000", "code": "vllm-code.llm.svc.cluster.local:9000"},
    "lora-on-demand": {"chat": "vllm-chat.llm.svc.cluster.local:8000"},
}


def values(policy: str, mode: str = "istio-gateway", **istio: Any) -> dict[str, Any]:
    routing = {"poolServices": SERVICES.get(policy, {}), **istio.pop("routing", {})}
    return {"mode": mode, **POLICIES[policy], "istio": {**istio, "routing": routing}}


def rendered(chart: Chart, mode: str, policy: str, **istio: Any) -> tuple[list[dict[str, Any]], Policy]:
    objects = chart.template(values(policy, mode, **istio))
    return objects, parse_policy(policy_text(objects))


def renderer_filter(policy: Policy, name: str) -> dict[str, Any]:
    found = [f for f in http_filters(policy) if f["name"] == name]
    assert len(found) == 1
    return found[0]


@pytest.mark.parametrize("policy_name", POLICIES)
@pytest.mark.parametrize("mode", CONTEXT)
def test_ext_proc_is_inserted_before_the_router_as_rendered(chart: Chart, mode: str, policy_name: str) -> None:
    objects, policy = rendered(chart, mode, policy_name)
    patch = http_filter_patch(objects, "envoy.filters.http.ext_proc")
    assert patch["match"]["context"] == CONTEXT[mode]
    chain = patch["match"]["listener"]["filterChain"]["filter"]
    assert chain["name"] == "envoy.filters.network.http_connection_manager"
    assert chain["subFilter"]["name"] == "envoy.filters.http.router"
    assert patch["patch"]["operation"] == "INSERT_BEFORE"

    ours = patch["patch"]["value"]["typed_config"]
    expected = renderer_filter(policy, "envoy.filters.http.ext_proc")["typed_config"]
    assert ours["processing_mode"] == expected["processing_mode"]
    assert ours["processing_mode"]["request_header_mode"] == "SEND"
    assert ours["processing_mode"]["request_body_mode"] == (
        "BUFFERED" if policy.envoy.request_body_mode == "buffered" else "STREAMED")
    assert ours["processing_mode"]["response_header_mode"] == "SKIP"  # rate-limit headers come from metadata
    assert "allow_mode_override" not in ours  # nothing turns the response phase on per request
    assert ours["failure_mode_allow"] is expected["failure_mode_allow"] is True  # the route table fails closed
    assert ours["message_timeout"] == expected["message_timeout"]
    # Everything but the cluster is the renderer's configuration, field for field.
    assert {k: v for k, v in ours.items() if k != "grpc_service"} == \
        {k: v for k, v in expected.items() if k != "grpc_service"}
    assert ours["grpc_service"] == {"envoy_grpc": {
        "cluster_name": f"outbound|{policy.service.grpc_port}||{FULLNAME}.{NAMESPACE}.svc.cluster.local"}}


@pytest.mark.parametrize("policy_name", POLICIES)
@pytest.mark.parametrize("mode", CONTEXT)
def test_header_mutation_strips_routing_headers_before_ext_proc(chart: Chart, mode: str, policy_name: str) -> None:
    objects, policy = rendered(chart, mode, policy_name)
    patch = http_filter_patch(objects, "envoy.filters.http.header_mutation")
    assert patch["match"]["context"] == CONTEXT[mode]
    assert patch["match"]["listener"]["filterChain"]["filter"]["subFilter"]["name"] == "envoy.filters.http.ext_proc"
    assert patch["patch"]["operation"] == "INSERT_BEFORE"
    expected = renderer_filter(policy, "envoy.filters.http.header_mutation")["typed_config"]
    assert patch["patch"]["value"]["typed_config"] == expected
    removed = [m["remove"] for m in expected["mutations"]["request_mutations"]]
    assert removed[:2] == [policy.envoy.cluster_header, policy.envoy.endpoint_header]
    tenant_headers = [policy.auth.tenant_header, policy.auth.tier_header]
    assert removed[2:] == ([] if policy.auth.mode == "trusted-header" else tenant_headers)


@pytest.mark.parametrize("sse", [False, True])
@pytest.mark.parametrize("policy_name", POLICIES)
def test_patched_filter_chain_is_the_rendered_chain(chart: Chart, policy_name: str, sse: bool) -> None:
    objects = chart.template(values(policy_name, usageMetadata={"sse": sse}))
    expected = http_filters(parse_policy(policy_text(objects)))
    if not sse:
        expected = [f for f in expected if f["name"] != "envoy.filters.http.sse_to_metadata"]
    assert istio_filter_chain(objects, EXTPROC_CLUSTER) == expected


@pytest.mark.parametrize("policy_name", ["default", "audit"])
@pytest.mark.parametrize("mode", CONTEXT)
def test_access_logs_are_the_rendered_ones(chart: Chart, mode: str, policy_name: str) -> None:
    objects, policy = rendered(chart, mode, policy_name)
    log, *audit = access_logs(objects)
    cluster = log["typed_config"]["common_config"]["grpc_service"]["envoy_grpc"]
    assert cluster["cluster_name"] == f"outbound|9002||{FULLNAME}.{NAMESPACE}.svc.cluster.local"
    cluster["cluster_name"] = EXTPROC_CLUSTER
    assert [log, *audit] == access_log(policy)
    assert len(audit) == (policy_name == "audit")


@pytest.mark.parametrize("policy_name", POLICIES)
def test_dedicated_pool_clusters_equal_the_rendered_clusters(chart: Chart, policy_name: str) -> None:
    objects, policy = rendered(chart, "istio-gateway", policy_name, routing={"poolClusters": "dedicated"})
    added = [p["patch"]["value"] for p in config_patches(objects, "CLUSTER") if p["patch"]["operation"] == "ADD"]
    expected = [c for c in render_static(policy)["static_resources"]["clusters"] if c["name"] != EXTPROC_CLUSTER]
    assert [c["name"] for c in added] == [pool.name for pool in policy.pools]
    assert added == expected


@pytest.mark.parametrize("policy_name", POLICIES)
def test_mesh_pool_clusters_are_istios_own_with_the_override_host_policy_merged_in(chart: Chart,
                                                                                policy_name: str) -> None:
    objects, policy = rendered(chart, "istio-gateway", policy_name)
    services = {**{"llama-8b": "vllm-llama-8b.llm.svc.cluster.local:8000",
                   "qwen-embed": "vllm-qwen-embed.llm.svc.cluster.local:8000"}, **SERVICES.get(policy_name, {})}
    patches = list(config_patches(objects, "CLUSTER"))
    assert [p["patch"]["operation"] for p in patches] == ["MERGE"] * len(policy.pools)  # no cluster of our own
    rendered_clusters = {c["name"]: c for c in render_static(policy)["static_resources"]["clusters"]}
    for pool, patch in zip(policy.pools, patches, strict=True):
        host, _, port = services[pool.name].rpartition(":")
        # The pool header names Istio's cluster of the pool's Service, which the patch selects.
        assert pool.cluster == f"outbound|{port}||{host}"
        assert patch["match"]["cluster"] == {"service": host, "portNumber": int(port)}
        value = patch["patch"]["value"]
        assert value["lb_policy"] == "CLUSTER_PROVIDED"
        # The renderer's load balancing policy, and nothing else of its cluster: the mesh keeps its own TLS,
        # outlier detection and circuit breakers (DestinationRules).
        assert value["load_balancing_policy"] == rendered_clusters[pool.cluster]["load_balancing_policy"]
        assert set(value) == {"lb_policy", "load_balancing_policy"}


def test_mesh_pool_clusters_need_each_pool_s_service(chart: Chart) -> None:
    message = chart.template_error({"policy": CUSTOM_POLICY})
    assert "istio.routing.poolServices.chat must name the pool's ClusterIP Service as HOST:PORT" in message
    bad = chart.template_error(values("custom", routing={"poolServices": {"chat": "vllm-chat.llm.svc.cluster.local"}}))
    assert "/istio/routing/poolServices/chat" in bad  # the values schema: HOST:PORT


@pytest.mark.parametrize("policy_name", POLICIES)
def test_listener_buffer_follows_the_policy(chart: Chart, policy_name: str) -> None:
    objects, policy = rendered(chart, "istio-gateway", policy_name)
    static = render_static(policy)["static_resources"]
    (listener,) = config_patches(objects, "LISTENER")
    assert listener["patch"] == {"operation": "MERGE", "value": {
        "per_connection_buffer_limit_bytes": static["listeners"][0]["per_connection_buffer_limit_bytes"]}}


def rendered_hcm(policy: Policy) -> dict[str, Any]:
    config = render_static(policy)["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    hcm: dict[str, Any] = config["typed_config"]
    return hcm


@pytest.mark.parametrize("policy_name", POLICIES)
@pytest.mark.parametrize("mode", CONTEXT)
def test_routing_headers_are_stripped_before_the_route_is_chosen_as_rendered(chart: Chart, mode: str,
                                                                           policy_name: str) -> None:
    objects, policy = rendered(chart, mode, policy_name)
    for patch in config_patches(objects, "NETWORK_FILTER"):
        assert patch["match"]["context"] == CONTEXT[mode]
    hcm = istio_hcm(objects, {"stat_prefix": "outbound_0.0.0.0_8080"})
    expected = rendered_hcm(policy)["early_header_mutation_extensions"]
    assert hcm["early_header_mutation_extensions"] == expected
    removed = [m["remove"] for m in expected[0]["typed_config"]["mutations"]]
    assert policy.envoy.cluster_header in removed
    off = chart.template(values(policy_name, mode, earlyHeaderMutation=False))
    assert "early_header_mutation_extensions" not in istio_hcm(off, {})


VS_DESTINATION = "outbound|8000||vllm.llm.svc.cluster.local"
VS_ROUTES = [
    {"name": "llm", "match": {"prefix": "/v1/"}, "route": {"cluster": VS_DESTINATION, "timeout": "0s"}},
    {"name": "other", "match": {"prefix": "/"}, "route": {"cluster": "outbound|80||web.web.svc.cluster.local"}},
]


@pytest.mark.parametrize("policy_name", POLICIES)
def test_route_patches_make_the_virtualservice_route_the_rendered_routes(chart: Chart, policy_name: str) -> None:
    objects, policy = rendered(chart, "istio-gateway", policy_name)
    expected = route_config(policy)["virtual_hosts"][0]["routes"]
    llm, *inserted, other = istio_routes(objects, VS_ROUTES)
    assert other == VS_ROUTES[1]  # another route of the virtual host is left alone
    # The VirtualService's destination is replaced by the pool header; retries stay the VirtualService's.
    assert llm["route"] == {"cluster_header": expected[0]["route"]["cluster_header"],
                            "timeout": expected[0]["route"]["timeout"]}
    # Only requests ext_proc routed (pool header present) take that route; the rest take the inserted one:
    # the rendered unrouted route (fail closed: a 500) or fallback route (fail open).
    assert llm["match"] == {"prefix": "/v1/", "headers": expected[0]["match"]["headers"]}
    assert expected[0]["match"]["headers"] == [{"name": policy.envoy.cluster_header, "present_match": True}]
    (unrouted,) = inserted
    assert unrouted["match"] == expected[1]["match"] == {"prefix": "/"}
    if not policy.envoy.failure_mode_allow:
        assert unrouted["name"] == "llm-unrouted"
        assert unrouted["direct_response"] == expected[1]["direct_response"]
        assert unrouted["response_headers_to_add"] == expected[1]["response_headers_to_add"]
        return
    assert unrouted["name"] == "llm-fallback"
    assert unrouted["route"] == expected[1]["route"]
    # The fallback pool's cluster: Istio's own of its Service.
    assert unrouted["route"]["cluster"] == next(p.cluster for p in policy.pools if p.name == policy.envoy.fallback_pool)


def test_without_the_route_guard_ext_proc_fails_as_the_policy_says(chart: Chart) -> None:
    for istio in ({"routing": {"survivesServiceFailure": False}}, {"routing": {"routeName": ""}}):
        objects = chart.template({"istio": istio})
        ext_proc = http_filter_patch(objects, "envoy.filters.http.ext_proc")["patch"]["value"]["typed_config"]
        assert ext_proc["failure_mode_allow"] is False
        llm, *inserted, _ = istio_routes(objects, VS_ROUTES)
        assert inserted == [] and "headers" not in llm["match"]


@pytest.mark.parametrize(("policy", "timeouts"), [
    ({"envoy": {"request_headers_timeout_s": 2.5, "request_timeout_s": 90}}, ("2.5s", "90s")),
    ({}, ("10s", "61s")),  # unset: the longest class wait (30 s) + the message timeout (1 s) + 30 s
    ({"flow_control": {"classes": {"slow": {"priority": 1, "max_wait_s": 120}}, "default_class": "slow"},
      "envoy": {"message_timeout_ms": 500}}, ("10s", "150.5s")),
    ({"flow_control": {"enabled": False}}, ("10s", "60s")),  # at least 60 s
])
def test_slow_client_timeouts_are_the_rendered_ones(chart: Chart, policy: dict[str, Any],
                                                    timeouts: tuple[str, str]) -> None:
    objects = chart.template({"policy": policy})
    hcm = istio_hcm(objects, {})
    expected = rendered_hcm(parse_policy(policy_text(objects)))
    assert (hcm["request_headers_timeout"], hcm["request_timeout"]) == (
        expected["request_headers_timeout"], expected["request_timeout"]) == timeouts


def test_grpc_token_goes_to_ext_proc_and_the_access_log(chart: Chart) -> None:
    objects = chart.template({"grpcAuth": {"token": "t0k3n"}})
    expected = [{"key": "x-extproc-token", "value": "t0k3n"}]
    ext_proc = http_filter_patch(objects, "envoy.filters.http.ext_proc")["patch"]["value"]["typed_config"]
    assert ext_proc["grpc_service"]["initial_metadata"] == expected
    assert access_logs(objects)[0]["typed_config"]["common_config"]["grpc_service"]["initial_metadata"] == expected


def test_fallback_route_match_and_timeout_can_be_set(chart: Chart) -> None:
    chosen = values("custom", routing={"timeout": "30s", "fallbackMatch": {"prefix": "/v1/"}})
    llm, fallback, _ = istio_routes(chart.template(chosen), VS_ROUTES)
    assert llm["route"]["timeout"] == fallback["route"]["timeout"] == "30s"
    assert fallback["match"] == {"prefix": "/v1/"}


def test_gateway_and_sidecar_selection(chart: Chart) -> None:
    gateway = find(chart.template({"mode": "istio-gateway", "istio": {"envoyFilterNamespace": "istio-system"}}),
                   "EnvoyFilter")
    assert gateway["metadata"]["namespace"] == "istio-system"
    assert gateway["spec"]["workloadSelector"] == {"labels": {"istio": "ingressgateway"}}
    sidecar_values = {"mode": "istio-sidecar", "istio": {"sidecar": {"workloadSelector": {"app": "rag"}, "port": 8100}}}
    sidecar = find(chart.template(sidecar_values), "EnvoyFilter")
    assert sidecar["metadata"]["namespace"] == NAMESPACE
    assert sidecar["spec"]["workloadSelector"] == {"labels": {"app": "rag"}}
    for patch in sidecar["spec"]["configPatches"]:
        assert patch["match"]["context"] == "SIDECAR_OUTBOUND"
        if patch["applyTo"] in ("HTTP_FILTER", "LISTENER"):
            assert patch["match"]["listener"]["portNumber"] == 8100


def test_optional_patches_can_be_turned_off(chart: Chart) -> None:
    objects = chart.template({"istio": {"patchBufferLimit": False, "accessLog": False, "usageMetadata": {"json": False},
                                        "earlyHeaderMutation": False, "requestTimeouts": False,
                                        "routing": {"poolClusters": "none", "routeName": ""}}})
    patches = find(objects, "EnvoyFilter")["spec"]["configPatches"]
    # ext_proc, header_mutation, and the buffer filter of the default (prebuffered) body mode, which is not optional
    assert [p["applyTo"] for p in patches] == ["HTTP_FILTER"] * 3
    assert patches[2]["patch"]["value"]["name"] == "envoy.filters.http.buffer"


def test_dedicated_extproc_cluster_targets_the_headless_service(chart: Chart) -> None:
    objects = chart.template({"istio": {"extprocCluster": {"mode": "dedicated"}}})
    headless = find(objects, "Service", f"{FULLNAME}-headless")
    assert headless["spec"]["clusterIP"] == "None"
    name = http_filter_patch(objects, "envoy.filters.http.ext_proc")["patch"]["value"]["typed_config"][
        "grpc_service"]["envoy_grpc"]["cluster_name"]
    added = [p["patch"]["value"] for p in config_patches(objects, "CLUSTER") if p["patch"]["operation"] == "ADD"]
    (cluster,) = [c for c in added if c["name"] == name]
    assert cluster["type"] == "STRICT_DNS"
    address = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
    assert address == {"address": f"{FULLNAME}-headless.{NAMESPACE}.svc.cluster.local", "port_value": 9002}
    assert "http2_protocol_options" in str(cluster["typed_extension_protocol_options"])


TRACED = {"tracing": {"enabled": True, "otlp_endpoint": "otel-collector.observability.svc.cluster.local:4317",
                      "sample_ratio": 0.05}}


@pytest.mark.parametrize("mode", CONTEXT)
def test_envoy_tracer_and_its_collector_are_the_rendered_ones(chart: Chart, mode: str) -> None:
    objects = chart.template({**values("default", mode), "policy": TRACED})
    policy = parse_policy(policy_text(objects))
    assert istio_hcm(objects, {})["tracing"] == envoy_tracing(policy)
    added = [p["patch"]["value"] for p in config_patches(objects, "CLUSTER") if p["patch"]["operation"] == "ADD"]
    otel = otel_cluster(policy)
    assert otel is not None
    del otel["@type"]
    assert [c for c in added if c["name"] == OTEL_CLUSTER] == [otel]
    # Off when the policy does not trace, when Envoy's tracer is not wanted, or when the mesh keeps its own.
    for off in ({**values("default", mode)}, {**values("default", mode), "policy": {"tracing": {
            **TRACED["tracing"], "envoy": False}}}, {**values("default", mode, tracing=False), "policy": TRACED}):
        objects = chart.template(off)
        assert "tracing" not in istio_hcm(objects, {})
        assert OTEL_CLUSTER not in [p["patch"]["value"].get("name") for p in config_patches(objects, "CLUSTER")]
