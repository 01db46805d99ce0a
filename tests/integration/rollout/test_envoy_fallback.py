"""The fallback route configuration against a real Envoy: `--mode validate`, then live file-RDS updates."""

from __future__ import annotations

import copy
import subprocess
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from extproc.bench.httpclient import HttpClient
from extproc.bench.procs import ProcessGroup, wait_port
from extproc.config import load_policy, parse_policy
from extproc.rollout.envoy_sync import FallbackRoute, FallbackRouteWriter, render_fallback_route
from extproc.xds.render import dump, render_static, route_config
from tests.support import envoy_binary, eventually, free_ports

pytestmark = pytest.mark.integration

_T = "type.googleapis.com/envoy."
POOLS = ("v1", "v2")
EXAMPLE = Path(__file__).parents[3] / "policies" / "example.yaml"


def policy_text(ports: dict[str, int]) -> str:
    pools = "\n".join(f"  - {{name: {p}, model: m/{p}, endpoints: [\"127.0.0.1:{ports[p]}\"]}}" for p in POOLS)
    return f"pools:\n{pools}\n"


def bootstrap(listen_port: int, admin_port: int, backend_ports: dict[str, int],
              routes: dict[str, Any]) -> dict[str, Any]:
    """A minimal static bootstrap: one listener, a router, a STATIC cluster named like each pool."""
    hcm = {
        "@type": _T + "extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "t", **routes,
        "http_filters": [{"name": "envoy.filters.http.router",
                          "typed_config": {"@type": _T + "extensions.filters.http.router.v3.Router"}}],
    }
    clusters = [{
        "name": pool, "type": "STATIC", "connect_timeout": "1s",
        "load_assignment": {"cluster_name": pool, "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
            "socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]},
    } for pool, port in backend_ports.items()]
    return {
        "node": {"id": "rollout-test", "cluster": "rollout-test"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {
            "listeners": [{"name": "l", "address": {"socket_address": {"address": "127.0.0.1",
                                                                        "port_value": listen_port}},
                           "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                           "typed_config": hcm}]}]}],
            "clusters": clusters,
        },
    }


def inline(config: dict[str, Any]) -> dict[str, Any]:
    return {"route_config": {k: v for k, v in config.items() if k != "@type"}}


def validate(path: Path) -> None:
    result = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(path)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_minimal_bootstrap_with_fallback_routes_validates(tmp_path: Path) -> None:
    ports = dict(zip(POOLS, free_ports(2), strict=True))
    base = route_config(parse_policy(policy_text(ports)))
    rendered = render_fallback_route(base, cluster_header="x-gateway-pool", default_model="chat",
                                     routes=[FallbackRoute("chat", {"v1": 0.95, "v2": 0.05}),
                                             FallbackRoute("solo", {"v2": 1.0})])
    path = tmp_path / "envoy.yaml"
    path.write_text(dump(bootstrap(10000, 10001, ports, inline(rendered))))
    validate(path)


def test_full_rendered_policy_with_fallback_routes_validates(tmp_path: Path) -> None:
    policy = load_policy(EXAMPLE)
    pools = [p.name for p in policy.pools]
    static = render_static(policy)
    hcm = static["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    rendered = render_fallback_route(route_config(policy), cluster_header=policy.envoy.cluster_header,
                                     default_model="chat", total_weight=1000,
                                     routes=[FallbackRoute("chat", {pools[0]: 0.75, pools[-1]: 0.25})])
    hcm["route_config"] = inline(rendered)["route_config"]
    path = tmp_path / "envoy.yaml"
    path.write_text(dump(static))
    validate(path)


@pytest.fixture
async def backends() -> AsyncIterator[dict[str, int]]:
    """One HTTP server per pool answering with the pool's name."""
    ports = dict(zip(POOLS, free_ports(2), strict=True))
    runners: list[web.AppRunner] = []
    for pool, port in ports.items():
        async def answer(request: web.Request, pool: str = pool) -> web.Response:
            return web.Response(text=pool)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", answer)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
    try:
        yield ports
    finally:
        for runner in runners:
            await runner.cleanup()


async def served_by(client: HttpClient, port: int, count: int, headers: tuple[tuple[str, str], ...]) -> Counter[str]:
    seen: Counter[str] = Counter()
    for _ in range(count):
        response = await client.request("GET", "127.0.0.1", port, "/v1/models", headers, timeout_s=5)
        seen[response.body.decode() if response.status == 200 else str(response.status)] += 1
    return seen


async def test_envoy_follows_rewritten_weights(tmp_path: Path, backends: dict[str, int]) -> None:
    listen, admin = free_ports(2)
    base = route_config(parse_policy(policy_text(backends)))
    rds_dir = tmp_path / "xds"
    rds_dir.mkdir()
    rds = rds_dir / "rds.yaml"
    writer = FallbackRouteWriter(rds, base, cluster_header="x-gateway-pool", default_model="chat")
    await writer({"chat": {"v1": 0.75, "v2": 0.25}})
    source = {"rds": {"route_config_name": base["name"], "config_source": {
        "path_config_source": {"path": str(rds), "watched_directory": {"path": str(rds_dir)}},
        "resource_api_version": "V3"}}}
    config = tmp_path / "envoy.yaml"
    config.write_text(yaml.safe_dump(bootstrap(listen, admin, backends, copy.deepcopy(source))))
    async with ProcessGroup(tmp_path / "logs") as group, HttpClient() as client:
        envoy = await group.start("envoy", [envoy_binary(), "-c", str(config), "--disable-hot-restart",
                                            "--concurrency", "1", "-l", "warning"])
        await wait_port("127.0.0.1", listen, 30, child=envoy)
        # Our service routed it: the pool header wins.
        assert await served_by(client, listen, 20, (("x-gateway-pool", "v2"),)) == {"v2": 20}
        # Bypassed: the model header's weighted clusters, 75/25 (binomial std over 800 = 1.5 pp; +-6 pp).
        split = await served_by(client, listen, 800, (("x-gateway-model", "chat"),))
        assert abs(split["v2"] / 800 - 0.25) < 0.06, split
        # The rollout promotes the canary: the file is swapped and Envoy follows within its file watch.
        await writer({"chat": {"v1": 0.0, "v2": 1.0}})
        async def followed() -> bool:
            return await served_by(client, listen, 10, ()) == {"v2": 10}

        await eventually(followed, "Envoy serving the rewritten route", timeout_s=10, interval_s=0.1)
        assert await served_by(client, listen, 50, (("x-gateway-model", "chat"),)) == {"v2": 50}
        assert writer.writes == 2
