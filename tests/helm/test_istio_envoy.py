"""The chart's EnvoyFilter, applied as Istio applies it to a minimal Istio-shaped listener (router only, one
VirtualService route), run by real Envoy in front of our service and the simulator.

No Istio runs here, so `tests.helm.chart` plays istiod's part (filter inserts, protobuf MERGE, route
inserts); the config Envoy runs is otherwise the chart's, and its behaviour is checked end to end: while our
service is killed under load with fail-open, requests go to the fallback pool, and no client picks a pool
by sending our routing header.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from extproc.bench.loadgen import Sample
from extproc.bench.procs import ProcessGroup
from extproc.bench.stack import SimPool, Stack, prepare, start_envoy, start_service, start_sim
from extproc.config import Policy, parse_policy
from extproc.xds.render import dump, render_static
from tests.helm.chart import Chart, istio_bootstrap, policy_text
from tests.support import Outage, kill_and_restart

pytestmark = pytest.mark.asyncio

MAIN = SimPool("main", "org/main", 2, aliases=("main",))
SPARE = SimPool("spare", "org/spare", 1, aliases=("spare",))
FAIL_OPEN = {"failure_mode_allow": True, "fallback_pool": "main", "message_timeout_ms": 200}


def istio_shaped(objects: list[dict[str, Any]], policy: Policy) -> dict[str, Any]:
    """The chart's patches on an Istio listener for a VirtualService route `llm` whose destination is pool
    `spare` (the one clients try to steer to), with ext_proc traffic to the renderer's cluster."""
    spare = next(pool.cluster or pool.name for pool in policy.pools if pool.name == "spare")
    routes = [{"name": "llm", "match": {"prefix": "/v1/"}, "route": {"cluster": spare, "timeout": "0s"}}]
    bootstrap = istio_bootstrap(objects, render_static(policy), routes, local_extproc=True)
    hcm = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    # Where each response came from: the test's probe, not part of the chart.
    hcm["route_config"]["virtual_hosts"][0]["response_headers_to_add"] = [
        {"header": {"key": "x-gateway-upstream-host", "value": "%UPSTREAM_REMOTE_ADDRESS%"}}]
    return bootstrap


SERVICES = {"main": "vllm-main.llm.svc.cluster.local:8000", "spare": "vllm-spare.llm.svc.cluster.local:8000"}


def chart_stack(tmp_path: Path, chart: Chart, istio: dict[str, Any], envoy: dict[str, Any] | None = None
                ) -> tuple[Stack, list[dict[str, Any]]]:
    """The test's stack and the chart's objects for its policy; the service runs with the pools' `cluster` the
    chart sets (Istio's own clusters of the pools' Services, into which the chart MERGEs the override_host policy)."""
    stack = prepare(tmp_path, [MAIN, SPARE], envoy=envoy)
    document = yaml.safe_load(stack.policy_path.read_text())
    routing = {"poolServices": SERVICES, **istio.get("routing", {})}
    objects = chart.template({"mode": "istio-gateway", "policy": document, "istio": {**istio, "routing": routing}})
    clusters = {pool.name: pool.cluster for pool in parse_policy(policy_text(objects)).pools}
    for pool in document["pools"]:
        if clusters[pool["name"]] is not None:
            pool["cluster"] = clusters[pool["name"]]
    stack.policy_path.write_text(yaml.safe_dump(document, sort_keys=False))
    stack.policy = parse_policy(stack.policy_path.read_text(), str(stack.policy_path))
    (stack.envoy_dir / "bootstrap.yaml").write_text(dump(istio_shaped(objects, stack.policy)))
    return stack, objects


async def run(tmp_path: Path, chart: Chart, istio: dict[str, Any]) -> tuple[Stack, Outage]:
    stack, _ = chart_stack(tmp_path, chart, istio, FAIL_OPEN)
    async with ProcessGroup(tmp_path / "logs") as group:
        stack.children["sim"] = await start_sim(group, tmp_path, [MAIN, SPARE], stack.sim_ports,
                                                ["--profile", "fast"])
        stack.children["service"] = await start_service(group, stack)
        stack.children["envoy"] = await start_envoy(group, stack)
        outage = await kill_and_restart(group, stack)
    return stack, outage


def served_by(stack: Stack, samples: list[Sample], pool: str) -> list[Sample]:
    hosts = {f"127.0.0.1:{port}" for port in stack.sim_ports[pool]}
    return [s for s in samples if s.headers.get("x-gateway-upstream-host") in hosts]


async def test_fail_open_serves_the_fallback_pool_and_ignores_client_routing_headers(tmp_path: Path,
                                                                                     chart: Chart) -> None:
    stack, outage = await run(tmp_path, chart, {})
    samples = outage.samples
    assert [s for s in samples if s.error is not None] == []
    assert len(served_by(stack, samples, "main")) == len(samples) > 150
    assert served_by(stack, samples, "spare") == []


async def test_without_early_header_mutation_a_client_header_picks_the_pool_while_the_service_is_down(
        tmp_path: Path, chart: Chart) -> None:
    # Why the chart strips the headers before the route is chosen: the HTTP header_mutation filter removes
    # the client's copy only after Envoy picked the route (and its cluster_header cluster), and nothing
    # picks it again when ext_proc fails open.
    # Our own pool clusters (named as the pools, which the attacking header names) keep the attack simple.
    dedicated = {"poolClusters": "dedicated"}
    stack, outage = await run(tmp_path, chart, {"earlyHeaderMutation": False, "routing": dedicated})
    steered = served_by(stack, outage.samples, "spare")
    assert steered, "expected the client's x-gateway-pool to win while the service was down"
    # Only during the outage (ext_proc re-routes otherwise); a request may meet the kill or the restart midway.
    # The behaviour is a time window: the outage's own timeline, with margins for a request caught at its edges.
    assert all(outage.killed_s - 0.1 < s.start_s < outage.back_s + 0.5 for s in steered)


async def test_fail_closed_a_routed_stream_outlives_the_service_and_the_rest_get_500(tmp_path: Path,
                                                                                     chart: Chart) -> None:
    # The chart's default (istio.routing.survivesServiceFailure): ext_proc fails open, the route table closed.
    stack, _ = chart_stack(tmp_path, chart, {})
    url = f"http://127.0.0.1:{stack.envoy_port}/v1/chat/completions"
    body = {"model": "main", "messages": [{"role": "user", "content": "x"}], "max_tokens": 600, "stream": True,
            "ignore_eos": True}
    async with ProcessGroup(tmp_path / "logs") as group:
        stack.children["sim"] = await start_sim(group, tmp_path, [MAIN, SPARE], stack.sim_ports,
                                                ["--profile", "fast"])
        stack.children["service"] = await start_service(group, stack)
        stack.children["envoy"] = await start_envoy(group, stack)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            routed = asyncio.Event()

            async def stream() -> tuple[int, bool, str]:
                async with http.post(url, json=body) as response:
                    routed.set()  # the response headers came: the decision reached Envoy
                    lines = [line async for line in response.content]
                    return (response.status, b"data: [DONE]\n" in lines,
                            response.headers.get("x-gateway-upstream-host", ""))

            running = asyncio.create_task(stream())
            await asyncio.wait_for(routed.wait(), 10)
            stack.children["service"].send_signal(signal.SIGKILL)
            status, done, host = await running
            assert (status, done) == (200, True)
            assert host in {f"127.0.0.1:{port}" for port in stack.sim_ports["main"]}
            async with http.post(url, json={**body, "stream": False, "max_tokens": 4}) as response:
                assert response.status == 500  # unrouted: the route table, not the VirtualService destination
                assert (await response.json())["error"]["code"] == "gateway_error"


async def test_istio_s_own_pool_cluster_with_the_merged_policy_sends_each_request_to_the_pick(
        tmp_path: Path, chart: Chart) -> None:
    stack, _ = chart_stack(tmp_path, chart, {})
    url = f"http://127.0.0.1:{stack.envoy_port}/v1/chat/completions"
    async with ProcessGroup(tmp_path / "logs") as group:
        stack.children["sim"] = await start_sim(group, tmp_path, [MAIN, SPARE], stack.sim_ports,
                                                ["--profile", "fast"])
        stack.children["service"] = await start_service(group, stack)
        stack.children["envoy"] = await start_envoy(group, stack)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            served: dict[str, int] = {}
            for index in range(24):  # alternating models: both pools' Istio clusters
                model = "main" if index % 2 else "spare"
                body = {"model": model, "messages": [{"role": "user", "content": f"q{index}"}], "max_tokens": 2}
                async with http.post(url, json=body) as response:
                    assert response.status == 200
                    host = response.headers["x-gateway-upstream-host"]
                    served[host] = served.get(host, 0) + 1
            async with http.get(f"{stack.admin_url}/debug/pools") as response:
                pools = (await response.json())["pools"]
    picked = {e["address"]: e["picked_total"] for pool in pools.values() for e in pool if e["picked_total"]}
    assert picked == served  # Envoy (least_request on its own) honoured every pick through the merged policy
    owners = {f"127.0.0.1:{port}": name for name, ports in stack.sim_ports.items() for port in ports}
    assert {owners[host] for host in served} == {"main", "spare"}  # through both pools' Istio clusters
