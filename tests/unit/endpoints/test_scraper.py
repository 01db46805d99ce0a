from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest
from aiohttp import web

from extproc.config.schema import SaturationConfig, ScrapeConfig
from extproc.endpoints import Endpoint, EndpointMetrics, EndpointRegistry, MetricsScraper
from extproc.endpoints.scraper import default_session, is_fresh

PAGE = (
    "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{model_name="m"} 3.0\n'
    'vllm:num_requests_waiting{model_name="m"} 1.0\n'
    'vllm:kv_cache_usage_perc{model_name="m"} 0.5\n'
    'vllm:prefix_cache_queries_total{model_name="m"} 10.0\n'
)
CONFIG = ScrapeConfig(interval_ms=20, timeout_ms=100)


class FakeVllm:
    """One /metrics server on 127.0.0.1 whose answer a test changes on the fly."""

    def __init__(self) -> None:
        self.status = 200
        self.body = PAGE
        self.chunked = False
        self.hang = False
        self.hits = 0
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
        port = self.runner.addresses[0][1]
        self.address = f"127.0.0.1:{port}"

    async def close(self) -> None:
        self.released.set()
        if self.runner is not None:
            await self.runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        self.hits += 1
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
async def servers() -> AsyncIterator[list[FakeVllm]]:
    """Three running servers; a test uses the ones it needs."""
    started = [FakeVllm() for _ in range(3)]
    await asyncio.gather(*(server.start() for server in started))
    yield started
    await asyncio.gather(*(server.close() for server in started))


def registry_of(*addresses: str) -> EndpointRegistry:
    registry = EndpointRegistry()
    registry.adopt([("pool", list(addresses))])
    return registry


def endpoint(registry: EndpointRegistry, address: str) -> Endpoint:
    return next(ep for ep in registry.endpoints() if ep.address == address)


async def eventually(condition: Callable[[], bool], within_s: float = 3.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def scraper_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if "MetricsScraper" in getattr(t.get_coro(), "__qualname__", "")]


async def test_scrapes_every_endpoint_and_stamps_with_the_injected_clock(
    servers: list[FakeVllm],
) -> None:
    first, second, _ = servers
    second.body = PAGE.replace("3.0", "7.0")
    registry = registry_of(first.address, second.address)
    async with MetricsScraper(registry, CONFIG, clock=lambda: 1234.5) as scraper:
        await eventually(lambda: all(ep.metrics is not None for ep in registry.endpoints()))
        a, b = endpoint(registry, first.address), endpoint(registry, second.address)
        assert a.metrics == EndpointMetrics(scraped_at=1234.5, running=3.0, waiting=1.0, kv_usage=0.5,
                                            prefix_queries=10.0)
        assert b.metrics is not None and b.metrics.running == 7.0
        await eventually(lambda: first.hits >= 3)  # keeps polling, once per interval
        assert a.scrape_failures == 0 and scraper.failures_total == 0 and scraper.scrapes_total >= 4


@pytest.mark.parametrize("fault", ["http-500", "timeout", "oversize", "oversize-chunked"])
async def test_failure_keeps_old_metrics_counts_and_recovers(servers: list[FakeVllm], fault: str) -> None:
    server = servers[0]
    registry = registry_of(server.address)
    ep = endpoint(registry, server.address)
    now = [1.0]
    scraper = MetricsScraper(registry, CONFIG, clock=lambda: now[0], max_body_bytes=len(PAGE) + 10)
    async with scraper:
        await eventually(lambda: ep.metrics is not None)
        good = ep.metrics
        now[0] = 2.0
        if fault == "http-500":
            server.status = 500
        elif fault == "timeout":
            server.hang = True
        else:
            server.body = PAGE * 3
            server.chunked = fault == "oversize-chunked"
        await eventually(lambda: ep.scrape_failures >= 2)
        assert ep.metrics is good
        assert scraper.failures_total >= 2
        server.status, server.hang, server.body, server.chunked = 200, False, PAGE, False
        server.released.set()
        await eventually(lambda: ep.scrape_failures == 0)
        assert ep.metrics is not None and ep.metrics.scraped_at == 2.0


async def test_refused_connection_counts_failures_without_metrics() -> None:
    registry = registry_of(f"127.0.0.1:{free_port()}")
    ep = registry.endpoints()[0]
    async with MetricsScraper(registry, CONFIG) as scraper:
        await eventually(lambda: ep.scrape_failures >= 3)
    assert ep.metrics is None
    assert scraper.failures_total == scraper.scrapes_total >= 3


async def test_a_hanging_endpoint_does_not_delay_the_others(servers: list[FakeVllm]) -> None:
    slow, fast, _ = servers
    slow.hang = True
    registry = registry_of(slow.address, fast.address)
    config = ScrapeConfig(interval_ms=20, timeout_ms=10_000)
    async with MetricsScraper(registry, config):
        await eventually(lambda: fast.hits >= 5)
        # One scrape in flight per endpoint: the hanging one is not asked again until it answers or times out.
        assert slow.hits == 1
        assert endpoint(registry, slow.address).scrape_failures == 0


async def test_picks_up_registry_changes_between_rounds(servers: list[FakeVllm]) -> None:
    first, second, _ = servers
    registry = registry_of(first.address)
    async with MetricsScraper(registry, CONFIG):
        await eventually(lambda: first.hits >= 1)
        assert second.hits == 0
        registry.adopt([("pool", [first.address, second.address])])
        await eventually(lambda: endpoint(registry, second.address).metrics is not None)
        registry.adopt([("pool", [second.address])])
        await asyncio.sleep(0.03)  # a scrape of `first` started before the sync may still land
        hits, later = first.hits, second.hits + 3
        await eventually(lambda: second.hits >= later)
        assert first.hits == hits


async def test_stop_cancels_scrapes_in_flight_and_leaves_no_tasks(servers: list[FakeVllm]) -> None:
    server = servers[0]
    server.hang = True
    registry = registry_of(server.address, f"127.0.0.1:{free_port()}")
    scraper = MetricsScraper(registry, ScrapeConfig(interval_ms=20, timeout_ms=5000))
    await scraper.start()
    await scraper.start()  # idempotent
    await eventually(lambda: server.hits == 1)
    assert scraper.running and scraper_tasks()
    started = time.monotonic()
    await scraper.stop()
    assert time.monotonic() - started < 1.0
    assert not scraper.running
    assert scraper_tasks() == []
    await scraper.stop()  # idempotent


async def test_disabled_scraper_does_nothing(servers: list[FakeVllm]) -> None:
    server = servers[0]
    registry = registry_of(server.address)
    made: list[aiohttp.ClientSession] = []

    def factory() -> aiohttp.ClientSession:
        session = default_session()
        made.append(session)
        return session

    async with MetricsScraper(registry, ScrapeConfig(enabled=False, interval_ms=20), session_factory=factory) as s:
        await asyncio.sleep(0.05)
        assert not s.running
    assert made == [] and server.hits == 0 and scraper_tasks() == []


async def test_injected_session_is_used_and_closed(servers: list[FakeVllm]) -> None:
    server = servers[0]
    registry = registry_of(server.address)
    made: list[aiohttp.ClientSession] = []

    def factory() -> aiohttp.ClientSession:
        session = aiohttp.ClientSession(headers={"x-test": "1"})
        made.append(session)
        return session

    async with MetricsScraper(registry, CONFIG, session_factory=factory):
        await eventually(lambda: registry.endpoints()[0].metrics is not None)
    assert len(made) == 1 and made[0].closed


async def test_logs_once_per_state_change_not_per_failure(
    servers: list[FakeVllm], caplog: pytest.LogCaptureFixture
) -> None:
    server = servers[0]
    server.status = 503
    registry = registry_of(server.address)
    ep = registry.endpoints()[0]
    caplog.set_level(logging.INFO, logger="extproc.endpoints.scraper")
    async with MetricsScraper(registry, CONFIG):
        await eventually(lambda: ep.scrape_failures >= 4)
        server.status = 200
        await eventually(lambda: ep.metrics is not None)
        server.status = 500
        await eventually(lambda: ep.scrape_failures >= 3)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        f"metrics scrape of {server.address} failing: HTTP 503",
        f"metrics scrape of {server.address} recovered",
        f"metrics scrape of {server.address} failing: HTTP 500",
    ]


class FlakyRegistry(EndpointRegistry):
    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def endpoints(self) -> list[Endpoint]:
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("boom")
        return super().endpoints()


async def test_an_error_in_a_round_is_logged_once_and_scraping_goes_on(
    servers: list[FakeVllm], caplog: pytest.LogCaptureFixture
) -> None:
    server = servers[0]
    registry = FlakyRegistry(failures=3)
    registry.adopt([("pool", [server.address])])
    with caplog.at_level(logging.ERROR, logger="extproc.endpoints.scraper"):
        async with MetricsScraper(registry, CONFIG):
            await eventually(lambda: registry.failures == 0 and server.hits >= 1)
    assert [r.getMessage() for r in caplog.records] == ["metrics scrape round failed"]


def test_is_fresh() -> None:
    ep = Endpoint("10.0.0.1:8000")
    assert not is_fresh(ep, 10.0, 1.0)
    ep.metrics = EndpointMetrics(scraped_at=9.0)
    assert is_fresh(ep, 10.0, 1.0)
    assert not is_fresh(ep, 10.5, 1.0)


async def test_hands_each_scrape_to_its_endpoint_with_the_current_rules_and_notifies(
        servers: list[FakeVllm]) -> None:
    first, _, _ = servers
    registry = registry_of(first.address)
    rules: list[SaturationConfig] = []
    notified: list[int] = []

    def saturation() -> SaturationConfig:
        rules.append(SaturationConfig(sustain_ms=0))
        return rules[-1]

    scraper = MetricsScraper(registry, CONFIG, clock=lambda: 50.0, saturation=saturation)
    scraper.on_scrape = lambda: notified.append(1)
    ep = endpoint(registry, first.address)
    lease = ep.lease()
    async with scraper:
        await eventually(lambda: len(notified) >= 2)
    lease.release()
    assert ep.metrics is not None and ep.metrics.waiting == 1.0 and ep.in_flight_at_scrape == 1
    assert len(rules) >= 2  # read at every scrape: a reload needs no call here
