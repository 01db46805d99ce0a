"""The scraper's HTTP transport against a real aiohttp server on 127.0.0.1: status, size bounds (with and
without a content-length), refused connections, the session it is given; and one scraper over real HTTP."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from extproc.config.schema import ScrapeConfig
from extproc.endpoints import EndpointRegistry, MetricsScraper
from extproc.endpoints.metrics_transport import HttpMetricsTransport, ScrapeFailed
from tests.support import eventually

pytestmark = pytest.mark.integration

PAGE = 'vllm:num_requests_running{model_name="m"} 3.0\nvllm:num_requests_waiting{model_name="m"} 1.0\n'


class FakeVllm:
    """One /metrics server on 127.0.0.1 whose answer a test changes on the fly."""

    def __init__(self) -> None:
        self.status = 200
        self.body = PAGE
        self.chunked = False
        self.hang = False
        self.hits = 0
        self.headers: list[dict[str, str]] = []
        self.released = asyncio.Event()
        self.runner: web.AppRunner | None = None
        self.address = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self.runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.address = f"127.0.0.1:{self.runner.addresses[0][1]}"

    async def close(self) -> None:
        self.released.set()
        if self.runner is not None:
            await self.runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        self.hits += 1
        self.headers.append(dict(request.headers))
        if self.hang:
            await self.released.wait()
        if self.chunked:
            response = web.StreamResponse(status=self.status)
            response.enable_chunked_encoding()
            await response.prepare(request)
            for start in range(0, len(self.body), 1000):
                await response.write(self.body[start:start + 1000].encode())
            await response.write_eof()
            return response
        return web.Response(status=self.status, text=self.body)


@pytest.fixture
async def server() -> AsyncIterator[FakeVllm]:
    running = FakeVllm()
    await running.start()
    yield running
    await running.close()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_fetches_the_page_uncompressed_and_closes_its_session(server: FakeVllm) -> None:
    transport = HttpMetricsTransport()
    try:
        assert await transport.fetch(server.address) == PAGE
    finally:
        await transport.close()
    assert server.headers[0]["Accept-Encoding"] == "identity" and server.headers[0]["Accept"] == "text/plain"


async def test_uses_the_session_it_is_given(server: FakeVllm) -> None:
    made: list[aiohttp.ClientSession] = []

    def factory() -> aiohttp.ClientSession:
        made.append(aiohttp.ClientSession(headers={"x-test": "1"}))
        return made[-1]

    transport = HttpMetricsTransport(factory, path="/metrics")
    await transport.fetch(server.address)
    await transport.close()
    assert len(made) == 1 and made[0].closed and server.headers[0]["x-test"] == "1"


@pytest.mark.parametrize(("fault", "message"), [
    ("http-500", "HTTP 500"),
    ("oversize", f"response larger than {len(PAGE) + 10} bytes"),
    ("oversize-chunked", f"response larger than {len(PAGE) + 10} bytes"),  # no content-length: counted as read
])
async def test_an_unusable_reply_is_a_scrape_failure_naming_it(server: FakeVllm, fault: str, message: str) -> None:
    if fault == "http-500":
        server.status = 500
    else:
        server.body = PAGE * 3
        server.chunked = fault == "oversize-chunked"
    transport = HttpMetricsTransport(max_body_bytes=len(PAGE) + 10)
    try:
        with pytest.raises(ScrapeFailed) as failure:
            await transport.fetch(server.address)
    finally:
        await transport.close()
    assert str(failure.value) == message


async def test_a_refused_connection_is_a_scrape_failure() -> None:
    transport = HttpMetricsTransport()
    try:
        with pytest.raises(ScrapeFailed, match=r"^cannot connect: "):
            await transport.fetch(f"127.0.0.1:{closed_port()}")
    finally:
        await transport.close()


async def test_scraper_over_http_gives_up_on_a_hanging_endpoint_and_recovers(server: FakeVllm) -> None:
    registry = EndpointRegistry()
    registry.adopt([("pool", [server.address])])
    ep = registry.endpoints()[0]
    async with MetricsScraper(registry, ScrapeConfig(interval_ms=20, timeout_ms=50)) as scraper:
        await eventually(lambda: ep.metrics is not None, "a first scrape over HTTP")
        good = ep.metrics
        server.hang = True
        await eventually(lambda: ep.scrape_failures >= 2, "two scrapes timed out")
        assert ep.metrics is good and scraper.failures_total >= 2
        server.hang = False
        server.released.set()
        await eventually(lambda: ep.scrape_failures == 0, "a good scrape after the hang")
        assert ep.metrics is not good
