"""Envoy-only baselines for `extproc bench routing`: the same pools balanced by Envoy's own LB, no ext_proc.

Each baseline gets a listener with only the router filter and, per pool, a copy of the rendered pool
cluster (same endpoints, outlier detection and circuit breakers) whose `lb_policy` is ROUND_ROBIN,
LEAST_REQUEST or RING_HASH instead of our override_host policy. Without ext_proc nobody reads the body, so the
client names the pool in `x-bench-pool` (as an Envoy-only deployment would route on a header or path) and, for
RING_HASH, the request's prompt group (shared prefix, conversation) in `x-bench-affinity`: a static prefix
affinity with no load awareness, which keeps the engines' caches warm. It is the Envoy hop without ext_proc at
a realistic engine load, where round robin's cache misses saturate the engines.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import yaml

from extproc.bench.procs import Child, ProcessGroup, wait_http_ok, wait_port
from extproc.bench.stack import Stack
from extproc.config import Policy
from extproc.xds import find_envoy
from extproc.xds.render import EXTPROC_CLUSTER, LISTENER, _pool_cluster, render_static, route_config

__all__ = ["AFFINITY_HEADER", "ENVOY_STRATEGIES", "POOL_HEADER", "envoy_only_bootstrap", "start_envoy_only",
           "variant_cluster"]

# Strategy name -> Envoy lb_policy.
ENVOY_STRATEGIES: Mapping[str, str] = MappingProxyType({
    "envoy-round-robin": "ROUND_ROBIN",
    "envoy-least-request": "LEAST_REQUEST",
    "envoy-ring-hash": "RING_HASH",
})
POOL_HEADER = "x-bench-pool"
AFFINITY_HEADER = "x-bench-affinity"
_HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"


def variant_cluster(pool_name: str, strategy: str) -> str:
    return f"{pool_name}.{strategy}"


def _cluster(policy: Policy, pool_index: int, strategy: str) -> dict[str, Any]:
    pool = policy.pools[pool_index]
    cluster = {k: v for k, v in _pool_cluster(pool, policy.envoy, None).items() if k != "@type"}
    name = variant_cluster(pool.name, strategy)
    cluster.pop("load_balancing_policy")
    cluster["name"] = name
    cluster["lb_policy"] = ENVOY_STRATEGIES[strategy]
    cluster["load_assignment"]["cluster_name"] = name
    return cluster


def _listener(policy: Policy, strategy: str, port: int) -> dict[str, Any]:
    # Same timeout, retries and upstream-host response header as the gateway's route, only the target differs.
    gateway_route = route_config(policy)["virtual_hosts"][0]["routes"][0]
    routes: list[dict[str, Any]] = []
    for pool in policy.pools:
        route = copy.deepcopy(gateway_route)
        route["match"] = {"prefix": "/", "headers": [{"name": POOL_HEADER, "string_match": {"exact": pool.name}}]}
        del route["route"]["cluster_header"]
        route["route"]["cluster"] = variant_cluster(pool.name, strategy)
        if ENVOY_STRATEGIES[strategy] == "RING_HASH":
            route["route"]["hash_policy"] = [{"header": {"header_name": AFFINITY_HEADER}}]
        routes.append(route)
    fallback = copy.deepcopy(routes[0])
    fallback["match"] = {"prefix": "/"}
    routes.append(fallback)
    name = f"bench_{strategy.replace('-', '_')}"
    return {
        "name": name,
        "address": {"socket_address": {"address": policy.envoy.listen_host, "port_value": port}},
        "per_connection_buffer_limit_bytes": policy.bounds.max_body_bytes + 65536,
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": _HCM,
                "stat_prefix": name,
                "codec_type": "AUTO",
                "stream_idle_timeout": f"{policy.envoy.stream_idle_timeout_s:g}s",
                "request_timeout": "0s",
                "route_config": {"name": name, "virtual_hosts": [{"name": name, "domains": ["*"], "routes": routes}]},
                "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": _ROUTER}}],
            },
        }]}],
    }


def envoy_only_bootstrap(
    policy: Policy, listeners: Mapping[str, int], *, keep_gateway: bool = True
) -> dict[str, Any]:
    """The policy's static bootstrap plus, per strategy in `listeners` (name -> port), a router-only
    listener and one cluster copy per pool. Without `keep_gateway` the ext_proc listener and cluster are
    left out, so Envoy can run with no service at all."""
    unknown = sorted(set(listeners) - set(ENVOY_STRATEGIES))
    if unknown:
        raise ValueError(f"not an Envoy-only strategy: {unknown}; known: {sorted(ENVOY_STRATEGIES)}")
    bootstrap = render_static(policy)
    resources = bootstrap["static_resources"]
    if not keep_gateway:
        resources["listeners"] = [item for item in resources["listeners"] if item["name"] != LISTENER]
        resources["clusters"] = [item for item in resources["clusters"] if item["name"] != EXTPROC_CLUSTER]
    for strategy, port in listeners.items():
        resources["listeners"].append(_listener(policy, strategy, port))
        resources["clusters"] += [_cluster(policy, index, strategy) for index in range(len(policy.pools))]
    return bootstrap


async def start_envoy_only(group: ProcessGroup, stack: Stack, strategy: str) -> Child:
    """Envoy alone balancing the stack's pools with `strategy`, on the gateway's listen port (no service)."""
    config = stack.workdir / "envoy-only.yaml"
    config.write_text(yaml.safe_dump(envoy_only_bootstrap(stack.policy, {strategy: stack.envoy_port},
                                                          keep_gateway=False), sort_keys=False))
    envoy = await group.start("envoy", [find_envoy(), "-c", str(config), "--log-level", "warn", "--concurrency", "1",
                                        "--disable-hot-restart"])
    await wait_http_ok(f"{stack.envoy_admin_url}/ready", 30, child=envoy)
    await wait_port("127.0.0.1", stack.envoy_port, 10, child=envoy)
    stack.children["envoy"] = envoy
    return envoy
