from __future__ import annotations

from typing import Any

import pytest
import yaml

from extproc.bench.routing_envoy import AFFINITY_HEADER, ENVOY_STRATEGIES, POOL_HEADER, envoy_only_bootstrap
from extproc.config import Policy, parse_policy

POLICY = {
    "service": {"grpc_port": 19002, "admin_port": 19003},
    "envoy": {"listen_port": 18080, "admin_port": 19901, "expose_upstream_host": True},
    "pools": [
        {"name": "chat", "model": "m", "endpoints": ["127.0.0.1:18101", "127.0.0.1:18102"]},
        {"name": "code", "model": "c", "endpoints": ["127.0.0.1:18201"]},
    ],
}


def _policy() -> Policy:
    return parse_policy(yaml.safe_dump(POLICY), "test.yaml")


def _filters(listener: dict[str, Any]) -> list[str]:
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return [f["name"] for f in hcm["http_filters"]]


def _routes(listener: dict[str, Any]) -> list[dict[str, Any]]:
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    routes: list[dict[str, Any]] = hcm["route_config"]["virtual_hosts"][0]["routes"]
    return routes


def test_variant_listeners_route_to_cluster_copies_with_envoy_lb_and_no_ext_proc() -> None:
    bootstrap = envoy_only_bootstrap(_policy(), {"envoy-round-robin": 18001, "envoy-least-request": 18002})
    resources = bootstrap["static_resources"]
    listeners = {item["name"]: item for item in resources["listeners"]}
    clusters = {item["name"]: item for item in resources["clusters"]}
    assert "envoy.filters.http.ext_proc" in _filters(listeners["llm_listener"])  # the gateway stays
    assert "extproc" in clusters
    for strategy, port, lb in (("envoy-round-robin", 18001, "ROUND_ROBIN"),
                               ("envoy-least-request", 18002, "LEAST_REQUEST")):
        listener = listeners[f"bench_{strategy.replace('-', '_')}"]
        assert listener["address"]["socket_address"]["port_value"] == port
        assert _filters(listener) == ["envoy.filters.http.router"]
        routes = _routes(listener)
        assert [r["route"]["cluster"] for r in routes] == [f"chat.{strategy}", f"code.{strategy}", f"chat.{strategy}"]
        assert routes[1]["match"]["headers"] == [{"name": POOL_HEADER, "string_match": {"exact": "code"}}]
        assert all("cluster_header" not in r["route"] for r in routes)
        assert routes[0]["response_headers_to_add"][0]["header"]["key"] == "x-gateway-upstream-host"
        for pool, original in (("chat", clusters["chat"]), ("code", clusters["code"])):
            copy = clusters[f"{pool}.{strategy}"]
            assert copy["lb_policy"] == lb and ENVOY_STRATEGIES[strategy] == lb
            assert "load_balancing_policy" not in copy
            assert copy["load_assignment"]["cluster_name"] == copy["name"]
            assert copy["load_assignment"]["endpoints"] == original["load_assignment"]["endpoints"]
            assert copy["outlier_detection"] == original["outlier_detection"]
            assert "load_balancing_policy" in original  # the gateway's clusters are untouched


def test_ring_hash_hashes_on_the_affinity_header_and_the_others_do_not() -> None:
    bootstrap = envoy_only_bootstrap(_policy(), {"envoy-ring-hash": 18003, "envoy-round-robin": 18001},
                                     keep_gateway=False)
    resources = bootstrap["static_resources"]
    listeners = {item["name"]: item for item in resources["listeners"]}
    clusters = {item["name"]: item for item in resources["clusters"]}
    for route in _routes(listeners["bench_envoy_ring_hash"]):
        assert route["route"]["hash_policy"] == [{"header": {"header_name": AFFINITY_HEADER}}]
    assert all("hash_policy" not in r["route"] for r in _routes(listeners["bench_envoy_round_robin"]))
    assert clusters["chat.envoy-ring-hash"]["lb_policy"] == "RING_HASH"


def test_without_gateway_there_is_no_ext_proc_anywhere() -> None:
    bootstrap = envoy_only_bootstrap(_policy(), {"envoy-round-robin": 18080}, keep_gateway=False)
    resources = bootstrap["static_resources"]
    assert [item["name"] for item in resources["listeners"]] == ["bench_envoy_round_robin"]
    assert "extproc" not in {item["name"] for item in resources["clusters"]}
    assert "ext_proc" not in yaml.safe_dump(resources["listeners"])


def test_unknown_strategy_is_rejected() -> None:
    with pytest.raises(ValueError, match="not an Envoy-only strategy"):
        envoy_only_bootstrap(_policy(), {"default": 18001})
