"""Admin HTTP: /metrics, /healthz, /readyz and read-only /debug views."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from extproc.endpoints import EndpointRegistry
from extproc.gateway import Gateway, RequestHead, SnapshotHolder
from extproc.limits.slices import Slices
from extproc.rollout.controller import RolloutError, Rollouts


def build_admin_app(
    metrics_registry: CollectorRegistry,
    endpoints: EndpointRegistry,
    snapshots: SnapshotHolder,
    is_ready: Callable[[], bool],
    gateway: Gateway,
    rollouts: Rollouts | None = None,
    slices: Slices | None = None,
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
        now = time.monotonic()
        states = gateway.health.states(now)
        data = {
            pool.name: [
                {"address": ep.address, "in_flight": ep.in_flight, "picked_total": ep.picked_total,
                 "available": gateway.health.available(ep, now), "breaker": states.get(ep.address, "closed"),
                 "scrape_failures": ep.scrape_failures,
                 "metrics_age_s": None if ep.metrics is None else round(now - ep.metrics.scraped_at, 3),
                 "waiting": None if ep.metrics is None else ep.metrics.waiting,
                 "running": None if ep.metrics is None else ep.metrics.running,
                 "kv_usage": None if ep.metrics is None else ep.metrics.kv_usage}
                for ep in pool.endpoints
            ]
            for pool in endpoints.pools()
        }
        return web.json_response({"config_version": snapshots.current.version, "pools": data,
                                  "prompt_calibration": gateway.calibration.describe()})

    async def explain(request: web.Request) -> web.Response:
        """POST {"path", "method"?, "headers"?, "body": object|string} -> the decision it would get now."""
        try:
            spec = await request.json()
        except ValueError:
            return web.json_response({"error": "body must be JSON"}, status=400)
        if not isinstance(spec, dict) or not isinstance(spec.get("path", "/v1/chat/completions"), str):
            return web.json_response({"error": "expected an object with 'path' and 'body'"}, status=400)
        body = spec.get("body", "")
        raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        headers = {str(k).lower(): str(v) for k, v in (spec.get("headers") or {}).items()}
        headers.setdefault("content-length", str(len(raw)))
        head = RequestHead(str(spec.get("method", "POST")), spec.get("path", "/v1/chat/completions"), headers,
                           end_of_stream=not raw)
        return web.json_response(gateway.explain(head, raw))

    async def limits(_: web.Request) -> web.Response:
        """This replica's slices of the limits (Redis store) and its fail-open view of them."""
        return web.json_response({"slices": slices.describe(time.time()) if slices is not None else []})

    async def flow(_: web.Request) -> web.Response:
        """Flow control per pool: queued per class, saturation, counters and the longest wait seen."""
        return web.json_response({"pools": gateway.flow.stats()})

    async def rollout_status(_: web.Request) -> web.Response:
        return web.json_response({"rollouts": rollouts.describe() if rollouts is not None else []})

    async def rollout_command(request: web.Request) -> web.Response:
        """POST /rollouts/{action}?model=M (promote [&to_end=1] | pause | resume | abort | restart)."""
        action, model = request.match_info["action"], request.query.get("model", "")
        if rollouts is None or not model:
            return web.json_response({"error": "needs ?model=NAME of a configured split"}, status=400)
        commands = {"promote": lambda: rollouts.promote(model, to_end=request.query.get("to_end") == "1"),
                    "pause": lambda: rollouts.pause(model), "resume": lambda: rollouts.resume(model),
                    "abort": lambda: rollouts.abort(model), "restart": lambda: rollouts.restart(model)}
        command = commands.get(action)
        if command is None:
            return web.json_response({"error": f"unknown action {action!r}; one of {sorted(commands)}"}, status=404)
        try:
            state = await command()
        except RolloutError as exc:
            return web.json_response({"error": str(exc)}, status=409)
        return web.json_response({"model": model, "state": str(state)})

    limit = snapshots.current.policy.bounds.max_body_bytes * 2 + 65536
    app = web.Application(client_max_size=limit)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/debug/pools", pools)
    app.router.add_post("/debug/explain", explain)
    app.router.add_get("/debug/rollouts", rollout_status)
    app.router.add_get("/debug/flow", flow)
    app.router.add_get("/debug/limits", limits)
    app.router.add_post("/rollouts/{action}", rollout_command)
    return app
