"""Admin HTTP: /metrics, /healthz, /readyz and read-only /debug views."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from extproc.endpoints import EndpointRegistry
from extproc.gateway import SnapshotHolder


def build_admin_app(
    metrics_registry: CollectorRegistry,
    endpoints: EndpointRegistry,
    snapshots: SnapshotHolder,
    is_ready: Callable[[], bool],
) -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(metrics_registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        ready = is_ready()
        return web.json_response({"ready": ready}, status=200 if ready else 503)

    async def pools(_: web.Request) -> web.Response:
        data = {
            pool.name: [
                {"address": ep.address, "in_flight": ep.in_flight, "picked_total": ep.picked_total}
                for ep in pool.endpoints
            ]
            for pool in endpoints.pools()
        }
        return web.json_response({"config_version": snapshots.current.version, "pools": data})

    app = web.Application(client_max_size=1024 * 1024)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/debug/pools", pools)
    return app
