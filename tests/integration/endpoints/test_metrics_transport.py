"""The scraper's HTTP transport against real servers on 127.0.0.1 (aiohttp, and raw asyncio streams for exact
bytes): status, size bounds (with and without a content-length), every body framing, keep-alive reuse and a
connection the server closed, hostile replies, refused connections; and one scraper over real HTTP."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

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


class RawServer:
    """An HTTP/1.1 server on asyncio streams answering each request with `reply` (bytes, as sent), then closing
    the connection when `close_after` is set (without saying so, as an idle timeout does)."""

    def __init__(self, reply: bytes, close_after: bool = False) -> None:
        self.reply = reply
        self.close_after = close_after
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                self.requests.append(await reader.readuntil(b"\r\n\r\n"))
                writer.write(self.reply)
                await writer.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


def reply(body: bytes, *headers: str) -> bytes:
    return ("HTTP/1.1 200 OK\r\n" + "".join(f"{h}\r\n" for h in headers) + "\r\n").encode() + body


async def test_one_keep_alive_connection_serves_every_round() -> None:
    server = RawServer(reply(PAGE.encode(), f"Content-Length: {len(PAGE)}"))
    address = await server.start()
    transport = HttpMetricsTransport()
    try:
        assert [await transport.fetch(address) for _ in range(3)] == [PAGE] * 3
    finally:
        await transport.close()
        server.close()
    assert server.connections == 1 and len(server.requests) == 3
    assert server.requests[0].startswith(b"GET /metrics HTTP/1.1\r\n")


@pytest.mark.parametrize("framing", ["length", "chunked", "close-delimited", "connection-close"])
async def test_a_connection_the_server_closes_is_replaced_and_every_framing_reads(framing: str) -> None:
    """The server closes after each reply, as an idle timeout would: the next scrape opens a new connection and
    reads its own reply, whichever way the body is framed."""
    data = PAGE.encode()
    sent = {"length": reply(data, f"Content-Length: {len(data)}"),
            "chunked": reply(b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\nx-trailer: 1\r\n\r\n" % (
                10, data[:10], len(data) - 10, data[10:]), "Transfer-Encoding: chunked"),
            "close-delimited": reply(data),
            "connection-close": reply(data, f"Content-Length: {len(data)}", "Connection: close")}[framing]
    server = RawServer(sent, close_after=True)
    address = await server.start()
    transport = HttpMetricsTransport()
    try:
        assert await transport.fetch(address) == PAGE
        assert await transport.fetch(address) == PAGE
    finally:
        await transport.close()
        server.close()
    assert server.connections == 2


@pytest.mark.parametrize(("sent", "message"), [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n" + b"x" * 5, None),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n", "bad content-length"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n", "bad chunk size"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1_0\r\n", "bad chunk size"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffff\r\n", "response larger than"),
    (b"SSH-2.0-OpenSSH\r\n\r\n", "bad status line"),
    (b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70_000 + b"\r\n\r\n", "response headers larger than"),
])
async def test_a_hostile_endpoint_gets_a_bounded_failure(sent: bytes, message: str | None) -> None:
    server = RawServer(sent, close_after=True)
    address = await server.start()
    transport = HttpMetricsTransport(max_body_bytes=1000)
    try:
        if message is None:
            assert await transport.fetch(address) == "xxxxx"
        else:
            with pytest.raises(ScrapeFailed, match=message):
                await transport.fetch(address)
    finally:
        await transport.close()
        server.close()


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
