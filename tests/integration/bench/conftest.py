"""A local aiohttp server (JSON, SSE, chunked, Connection: close, hanging) and raw-socket servers for the bench
client and load generator tests.

Nothing here answers "later": a request that must stay in flight waits for a fact (N requests in flight at
once, the test's `release`, the client going away). Only `/sse?delay=` paces tokens in time, for the tests
whose subject is a timing (TTFT before the end of a stream)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from aiohttp import web

RawHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclass
class ServerState:
    peers: set[tuple[str, int]] = field(default_factory=set)
    requests: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    disconnects: int = 0
    bodies: list[bytes] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)  # ends every /hang request
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)  # notified as requests arrive


@dataclass
class Server:
    port: int
    state: ServerState


def _sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _chunk(content: str) -> dict[str, object]:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": content}}]}


def build_app(state: ServerState) -> web.Application:
    @web.middleware
    async def track(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                    ) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if peer is not None:
            state.peers.add(tuple(peer[:2]))
        state.requests += 1
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            return await handler(request)
        except (asyncio.CancelledError, ConnectionResetError):
            state.disconnects += 1
            raise
        finally:
            state.in_flight -= 1

    async def json_handler(request: web.Request) -> web.Response:
        together = int(request.query.get("together", "0"))
        if together:  # answer only once `together` requests have been in flight at the same time
            async with state.changed:
                state.changed.notify_all()
                await state.changed.wait_for(lambda: state.max_in_flight >= together)
        body = {"id": "x", "choices": [{"message": {"content": "hi"}}],
                "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}
        return web.json_response(body, headers={"x-sim-replica": "r1"})

    async def echo(request: web.Request) -> web.Response:
        data = await request.read()
        state.bodies.append(data)
        return web.json_response({"len": len(data), "x-test": request.headers.get("x-test")})

    async def sse(request: web.Request) -> web.StreamResponse:
        n = int(request.query.get("n", "3"))
        delay = float(request.query.get("delay", "0"))
        hang_after = int(request.query.get("hang_after", "-1"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "x-sim-replica": "r2"})
        await resp.prepare(request)
        await resp.write(_sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}))
        for i in range(n):
            if i == hang_after:
                await state.release.wait()  # until the client goes away (or the test releases it)
            if delay:
                await asyncio.sleep(delay)  # simulated inter-token time: the timing a TTFT test measures
            await resp.write(_sse(_chunk(f"t{i}")))
        if request.query.get("usage", "1") == "1":
            await resp.write(_sse({"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": n}}))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def chunked_json(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        pad = b', "pad": "' + b"z" * 5000 + b'"}'
        parts = (b'{"usage": {"prompt_tokens": 1,', b' "completion_tokens": 2}', pad)
        for part in parts:
            await resp.write(part)
        await resp.write_eof()
        return resp

    async def close(request: web.Request) -> web.Response:
        resp = web.Response(text="bye")
        resp.force_close()
        return resp

    async def hang(request: web.Request) -> web.Response:
        await state.release.wait()  # until the client goes away (or the test releases it)
        return web.Response(text="late")

    async def status(request: web.Request) -> web.Response:
        return web.Response(status=int(request.match_info["code"]), text="status")

    app = web.Application(middlewares=[track])
    app.router.add_get("/json", json_handler)
    app.router.add_post("/echo", echo)
    app.router.add_get("/sse", sse)
    app.router.add_post("/sse", sse)
    app.router.add_get("/chunked-json", chunked_json)
    app.router.add_get("/close", close)
    app.router.add_get("/hang", hang)
    app.router.add_get("/status/{code}", status)
    return app


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    state = ServerState()
    runner = web.AppRunner(build_app(state), handler_cancellation=True, shutdown_timeout=0.2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield Server(port, state)
    finally:
        await runner.cleanup()


@pytest.fixture
async def raw_server() -> AsyncIterator[Callable[[RawHandler], Awaitable[int]]]:
    """Factory: start an asyncio.start_server on a random port with the given connection handler."""
    servers: list[asyncio.Server] = []

    async def start(handler: RawHandler) -> int:
        srv = await asyncio.start_server(handler, "127.0.0.1", 0)
        servers.append(srv)
        port: int = srv.sockets[0].getsockname()[1]
        return port

    yield start
    for srv in servers:
        srv.close()
        await srv.wait_closed()
