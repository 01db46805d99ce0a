"""Admin HTTP: open /metrics, /healthz, /readyz; protected /debug views and /rollouts commands.

Protected endpoints need `Authorization: Bearer <admin token>` (`service.admin_token_file`); without a
token they answer only connections from a loopback address that name a loopback host (so a web page cannot
reach them through DNS rebinding). Every POST needs `Content-Type: application/json`: a browser cannot
send that cross-origin without a CORS preflight, which this server never approves, so no page can make an
administrator's browser change state (CSRF). /debug/explain is rate-limited, decides as a tenant named by
the caller (it never checks API keys, so it cannot tell valid keys from invalid ones), and answers
malformed input with 400.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from extproc.gateway import Parts, RequestHead, RuntimeHolder
from extproc.gateway.auth import Authenticator
from extproc.limits.slices import Slices
from extproc.rollout.controller import RolloutError, Rollouts
from extproc.telemetry.loop_lag import LoopLag
from extproc.tenants import ANONYMOUS, Tenant

__all__ = ["OPEN_PATHS", "build_admin_app"]

OPEN_PATHS = frozenset({"/metrics", "/healthz", "/readyz"})
_LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
_SECRET_HEADERS = frozenset({"authorization", "x-api-key", "api-key", "cookie"})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers or None)


def _loopback(request: web.Request) -> bool:
    """A loopback peer that also named a loopback host (not a rebound DNS name)."""
    try:
        peer = ipaddress.ip_address((request.remote or "").split("%")[0])
    except ValueError:
        return False
    host = request.host.rsplit(":", 1)[0] if not request.host.startswith("[") else request.host[1:].split("]")[0]
    return peer.is_loopback and (host in _LOOPBACK_HOSTS or host.startswith("127."))


def access_guard(token: str | None) -> Middleware:
    expected = token.encode() if token is not None else None

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS and request.method in ("GET", "HEAD"):
            return await handler(request)
        if expected is not None:
            scheme, _, presented = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(presented.strip().encode(), expected):
                return _error(401, "admin token required (Authorization: Bearer)",
                              **{"www-authenticate": 'Bearer realm="extproc-admin"'})
        elif not _loopback(request):
            return _error(403, "no admin token is configured (service.admin_token_file): this endpoint answers "
                               "loopback connections only")
        if request.method not in ("GET", "HEAD") and request.content_type != "application/json":
            return _error(415, "POST needs Content-Type: application/json")
        return await handler(request)

    return guard


class _Bucket:
    """Calls per second with a burst of twice that (explain's rate limit)."""

    def __init__(self, rate: float) -> None:
        self.rate, self.burst = rate, 2 * rate
        self.level, self.at = self.burst, time.monotonic()

    def take(self) -> float:
        """0 when a call may go ahead, else the seconds until it may."""
        now = time.monotonic()
        self.level = min(self.burst, self.level + (now - self.at) * self.rate)
        self.at = now
        if self.level >= 1:
            self.level -= 1
            return 0.0
        return (1 - self.level) / self.rate


def _explain_spec(spec: Any, authenticator: Authenticator,
                  mode: str) -> tuple[RequestHead, bytes, Tenant | None] | web.Response:
    """The request an explain call describes, or a 400/404 answer for a malformed one."""
    if not isinstance(spec, dict):
        return _error(400, "expected an object with 'path', 'body' and (api-key mode) 'tenant'")
    path, method = spec.get("path", "/v1/chat/completions"), spec.get("method", "POST")
    headers, body, name = spec.get("headers") or {}, spec.get("body", ""), spec.get("tenant")
    if not isinstance(path, str) or not isinstance(method, str) or not isinstance(headers, dict):
        return _error(400, "'path' and 'method' must be strings, 'headers' an object")
    if not all(isinstance(v, str | int | float) for v in headers.values()) or not isinstance(name, str | None):
        return _error(400, "header values and 'tenant' must be strings")
    raw = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else json.dumps(body).encode()
    # Keys are never checked here: explain decides as the named tenant.
    clean = {str(k).lower(): str(v) for k, v in headers.items() if str(k).lower() not in _SECRET_HEADERS}
    clean.setdefault("content-length", str(len(raw)))
    tenant: Tenant | None = None
    if mode == "api-key":
        if name is None:
            return _error(400, "auth mode api-key: name the tenant to decide as ('tenant': NAME)")
        tenant = authenticator.keys.tenant(name)
        if tenant is None:
            return _error(404, f"no tenant named {name!r} in the keys file")
    elif mode == "none":
        tenant = ANONYMOUS
    return RequestHead(method, path, clean, end_of_stream=not raw), raw, tenant


def build_admin_app(
    metrics_registry: CollectorRegistry,
    runtimes: RuntimeHolder,
    is_ready: Callable[[], bool],
    parts: Parts,
    rollouts: Rollouts | None = None,
    token: str | None = None,
    slices: Slices | None = None,
    loop_lag: LoopLag | None = None,
) -> web.Application:
    explain_bucket = _Bucket(runtimes.current.policy.service.explain_per_s)
    gateway, health = parts.gateway, parts.health

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(metrics_registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        ready = is_ready()
        return web.json_response({"ready": ready}, status=200 if ready else 503)

    def _number(value: float | None) -> float | str | None:
        return "inf" if value is not None and math.isinf(value) else value

    async def pools(_: web.Request) -> web.Response:
        now = time.monotonic()
        states = health.states(now)
        runtime = runtimes.current
        data = {}
        for pool in runtime.pools.values():
            load = pool.load
            data[pool.name] = [
                {"address": ep.address, "in_flight": ep.in_flight, "picked_total": ep.picked_total,
                 "available": health.available(ep, now), "breaker": states.get(ep.address, "closed"),
                 "scrape_failures": ep.scrape_failures,
                 "metrics_age_s": None if ep.metrics is None else round(now - ep.metrics.scraped_at, 3),
                 "waiting": None if ep.metrics is None else ep.metrics.waiting,
                 "running": None if ep.metrics is None else ep.metrics.running,
                 "kv_usage": None if ep.metrics is None else ep.metrics.kv_usage,
                 # The load model's view (extproc.endpoints.load), shared by flow control and the scheduler.
                 "load": load.requests(ep, now), "capacity": load.capacity(ep, now),
                 "room": _number(load.room(ep, now)),
                 "peak_running": ep.engine.peak_running,
                 "queued_for_s": None if ep.engine.queued_since is None or ep.metrics is None
                 else round(ep.metrics.scraped_at - ep.engine.queued_since, 3)}
                for ep in pool.endpoints
            ]
        return web.json_response({"config_version": runtime.version, "pools": data,
                                  "prompt_calibration": parts.calibration.describe()})

    async def explain(request: web.Request) -> web.Response:
        """POST {"path", "method"?, "headers"?, "body": object|string, "tenant"?} -> the decision it would get."""
        wait_s = explain_bucket.take()
        if wait_s:
            return _error(429, "explain is rate-limited (service.explain_per_s)",
                          **{"retry-after": str(int(wait_s) + 1)})
        try:
            spec = json.loads(await request.read())
        except ValueError:  # also invalid UTF-8
            return _error(400, "body must be JSON")
        parsed = _explain_spec(spec, parts.authenticator, runtimes.current.policy.auth.mode)
        if isinstance(parsed, web.Response):
            return parsed
        head, raw, tenant = parsed
        return web.json_response(gateway.explain(head, raw, tenant))

    async def limits(_: web.Request) -> web.Response:
        """This replica's slices of the limits (Redis store) and its fail-open view of them."""
        return web.json_response({"slices": slices.describe(time.time()) if slices is not None else []})

    async def flow(_: web.Request) -> web.Response:
        """Flow control per pool: queued per class, saturation, counters and the longest wait seen."""
        return web.json_response({"pools": parts.flow.stats()})

    async def loop(_: web.Request) -> web.Response:
        """The event loop's lag: the last and the largest since start (extproc.telemetry.loop_lag)."""
        return web.json_response({"loop": loop_lag.describe() if loop_lag is not None else None})

    async def rollout_status(_: web.Request) -> web.Response:
        return web.json_response({"rollouts": rollouts.describe() if rollouts is not None else []})

    async def rollout_command(request: web.Request) -> web.Response:
        """POST /rollouts/{action}?model=M (promote [&to_end=1] | pause | resume | abort | restart)."""
        action, model = request.match_info["action"], request.query.get("model", "")
        if rollouts is None or not model:
            return _error(400, "needs ?model=NAME of a configured split")
        commands = {"promote": lambda: rollouts.promote(model, to_end=request.query.get("to_end") == "1"),
                    "pause": lambda: rollouts.pause(model), "resume": lambda: rollouts.resume(model),
                    "abort": lambda: rollouts.abort(model), "restart": lambda: rollouts.restart(model)}
        command = commands.get(action)
        if command is None:
            return _error(404, f"unknown action {action!r}; one of {sorted(commands)}")
        try:
            state = await command()
        except RolloutError as exc:
            return _error(409, str(exc))
        return web.json_response({"model": model, "state": str(state)})

    limit = runtimes.current.policy.bounds.max_body_bytes * 2 + 65536
    app = web.Application(client_max_size=limit, middlewares=[access_guard(token)])
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/debug/pools", pools)
    app.router.add_post("/debug/explain", explain)
    app.router.add_get("/debug/rollouts", rollout_status)
    app.router.add_get("/debug/flow", flow)
    app.router.add_get("/debug/limits", limits)
    app.router.add_get("/debug/loop", loop)
    app.router.add_post("/rollouts/{action}", rollout_command)
    return app
