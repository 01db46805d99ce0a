"""One simulated vLLM replica: its aiohttp app and listener, fault switches and admin endpoints."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from extproc.sim.driver import EngineLoop
from extproc.sim.engine import Engine
from extproc.sim.faults import FaultError, Faults, FaultSettings
from extproc.sim.lifecycle import Lifecycle
from extproc.sim.metrics import render_metrics
from extproc.sim.openai_routes import (
    CrashedError,
    OpenAIRoutes,
    RenderMemo,
    abort_connection,
    compact_json,
    read_json,
)
from extproc.sim.protocol import ApiError, error_body
from extproc.sim.router_routes import RouterRoutes
from extproc.sim.scoring_routes import ScoringRoutes
from extproc.sim.shaped_routes import ShapedRoutes
from extproc.sim.spec import ReplicaSpec
from extproc.sim.tokens import Tokenizer

__all__ = ["Replica"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SiblingLookup = Callable[[int], "Replica | None"]
_SHUTDOWN_GRACE_S = 1.0


def _error(status: int, message: str, param: str | None = None) -> web.Response:
    headers = {"Retry-After": "1"} if status == 429 else None
    return web.json_response(error_body(status, message, param), status=status, headers=headers,
                             dumps=compact_json)


class Replica:
    """Lives on one event loop; `start()` listens, `stop()` closes everything it opened."""

    def __init__(self, spec: ReplicaSpec, siblings: SiblingLookup | None = None,
                 clock: Callable[[], float] = time.monotonic, renders: RenderMemo | None = None) -> None:
        self.spec = spec
        self.port = spec.port
        self.engine = Engine(spec.profile, clock)
        self.engine.slow_factor = spec.faults.slow_factor
        self.loop = EngineLoop(self.engine)
        self.tokenizer = Tokenizer(spec.profile.vocab_size)
        # Output depends on the seed only (same prompt, same answer anywhere); fault draws differ per port.
        self.faults = Faults(spec.faults, spec.seed * 65_537 + spec.port)
        self._siblings = siblings
        self._hang_released = asyncio.Event()
        if not spec.faults.hang:
            self._hang_released.set()
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._resume_task: asyncio.Task[None] | None = None
        self.lifecycle = Lifecycle(spec, self.engine)
        self._routes = OpenAIRoutes(spec, self.engine, self.loop, self.tokenizer, self.faults,
                                    self.lifecycle.adapters, self.lifecycle.check_awake, renders)
        self.app = self._build_app()

    @property
    def address(self) -> str:
        return f"{self.spec.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    @property
    def listening(self) -> bool:
        return self._site is not None

    def _build_app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=64 * 1024 * 1024)
        app.add_routes(self._routes.routes())
        app.add_routes(ShapedRoutes(self._routes).routes())
        app.add_routes(ScoringRoutes(self._routes).routes())
        app.add_routes(RouterRoutes(self.spec, self.engine).routes())
        app.add_routes(self.lifecycle.routes())
        app.add_routes([
            web.get("/health", self._health),
            web.get("/ping", self._health),
            web.get("/version", self._version),
            web.get("/metrics", self._metrics),
            web.get("/sim/faults", self._get_faults),
            web.post("/sim/faults", self._post_faults),
            web.post("/sim/reset", self._reset),
            web.get("/sim/stats", self._stats),
            web.get("/sim/timings", self._timings),
        ])
        app.on_response_prepare.append(self._stamp)
        return app

    # -- lifecycle -------------------------------------------------------------------------------------

    async def start(self) -> None:
        # Client disconnects cancel the handler (vLLM aborts such requests too); on stop, streams in
        # flight get a short grace period, then are cut.
        runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None,
                               shutdown_timeout=_SHUTDOWN_GRACE_S)
        await runner.setup()
        self._runner = runner
        self.loop.start()
        try:
            if not self.faults.settings.refuse:
                await self._listen()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        if self._resume_task is not None:
            self._resume_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._resume_task
            self._resume_task = None
        if self._runner is not None:
            await self._runner.cleanup()
        self._runner = None
        self._site = None
        await self.loop.stop()

    async def _listen(self) -> None:
        assert self._runner is not None
        site = web.TCPSite(self._runner, self.spec.host, self.port, reuse_address=True)
        await site.start()
        self._site = site
        self.port = site.port

    async def _unlisten(self, spare: asyncio.BaseTransport | None = None) -> None:
        if self._site is not None:
            await self._site.stop()
            self._site = None
        server = self._runner.server if self._runner is not None else None
        # Like a dead server: every open connection is reset, idle keep-alive ones included (a plain close
        # of an idle aiohttp connection leaves the socket open and unread, so a peer's request would hang).
        # `spare` is the connection that asked for the refuse: it gets its answer, then closes.
        for connection in list(server.connections) if server is not None else ():
            transport = connection.transport
            if transport is spare:
                connection.close()
            elif transport is not None:
                transport.abort()

    async def update_faults(
        self, update: Mapping[str, Any], spare: asyncio.BaseTransport | None = None
    ) -> FaultSettings:
        """Apply a `POST /sim/faults` body; raises FaultError and changes nothing if it is invalid."""
        settings = self.faults.update(update)
        self.engine.slow_factor = settings.slow_factor
        if settings.hang:
            self._hang_released.clear()
        else:
            self._hang_released.set()
        if self._resume_task is not None and not self._resume_task.done():
            self._resume_task.cancel()
        self._resume_task = None
        if self._runner is None:
            return settings
        if settings.refuse:
            await self._unlisten(spare)
            if settings.refuse_for_s is not None:
                self._resume_task = asyncio.create_task(self._resume_after(settings.refuse_for_s))
        elif self._site is None:
            await self._listen()
        return settings

    async def _resume_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        self._resume_task = None
        await self.update_faults({"refuse": False, "refuse_for_s": None})

    # -- middleware ------------------------------------------------------------------------------------

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith("/sim/"):
            if self.faults.settings.refuse:
                # A request on a connection opened before the refuse: drop it like a dead server would.
                abort_connection(request)
                return web.Response(status=503)
            if not self._hang_released.is_set():
                await self._hang_released.wait()
        try:
            return await handler(request)
        except ApiError as exc:
            return _error(exc.status, exc.message, exc.param)
        except CrashedError:
            return web.Response(status=500)  # the transport is gone; nothing is sent

    async def _stamp(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers["x-sim-replica"] = self.address
        request_id = request.headers.get("x-request-id")
        if request_id is not None:
            response.headers["x-request-id"] = request_id

    # -- plain endpoints -------------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        if self.faults.settings.unhealthy:
            return web.Response(status=503)
        return web.Response(status=200)

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self.spec.profile.vllm_version})

    async def _metrics(self, request: web.Request) -> web.Response:
        text = render_metrics(self.spec.model, self.engine.counters, self.engine.gauges(time.time()))
        return web.Response(text=text, content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type-Options": "nosniff"})

    def stats(self) -> dict[str, Any]:
        counters = self.engine.counters
        kv = self.engine.kv
        return {
            "replica": self.address, "model": self.spec.model, "listening": self.listening,
            "requests": counters.requests, "running": len(self.engine.running),
            "waiting": len(self.engine.waiting) + len(self.engine.inbox), "steps": self.engine.steps,
            "preemptions": counters.preemptions, "prompt_tokens": counters.prompt_tokens,
            "generation_tokens": counters.generation_tokens,
            "prefix_queries_tokens": counters.prefix_queries_tokens,
            "prefix_hits_tokens": counters.prefix_hits_tokens, "finished": dict(counters.finished),
            "kv_usage": kv.usage, "kv_used_blocks": kv.used_blocks, "kv_cached_blocks": kv.cached_blocks,
            "num_gpu_blocks": kv.num_blocks, **self.lifecycle.stats(),
        }

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats(), dumps=compact_json)

    async def _timings(self, request: web.Request) -> web.Response:
        """The newest streamed requests' stamps (extproc/sim/timings.py)."""
        return web.json_response(self._routes.timings.dump(), dumps=compact_json)

    def _target(self, request: web.Request) -> Replica:
        """This replica, or a sibling in the same process named by `?port=N` (to revive a refusing one)."""
        port = request.query.get("port")
        if port is None or port == str(self.port):
            return self
        target = self._siblings(int(port)) if self._siblings is not None and port.isdigit() else None
        if target is None:
            raise ApiError(404, f"no replica on port {port} in this simulator", "port")
        return target

    async def _get_faults(self, request: web.Request) -> web.Response:
        target = self._target(request)
        return web.json_response(target.faults.settings.to_json(), dumps=compact_json)

    async def _post_faults(self, request: web.Request) -> web.Response:
        target = self._target(request)
        body = await read_json(request)
        try:
            settings = await target.update_faults(body, spare=request.transport)
        except FaultError as exc:
            raise ApiError(400, str(exc)) from exc
        return web.json_response(settings.to_json(), dumps=compact_json)

    async def _reset(self, request: web.Request) -> web.Response:
        target = self._target(request)
        target.engine.reset()
        return web.json_response(target.stats(), dumps=compact_json)

