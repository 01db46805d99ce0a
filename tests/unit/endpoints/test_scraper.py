"""The scraper's rounds, failure accounting and lifecycle, over an in-memory transport and a stepped sleep:
no sockets, and each round runs when the test says so. The HTTP transport is tested against a real server in
tests/integration/endpoints/test_metrics_transport.py."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import pytest

from extproc.config.schema import SaturationConfig, ScrapeConfig
from extproc.endpoints import Endpoint, EndpointMetrics, EndpointRegistry, MetricsScraper
from extproc.endpoints.load import LoadModel
from extproc.endpoints.metrics_transport import ScrapeFailed
from extproc.endpoints.scraper import is_fresh
from tests.support import SteppedSleep, eventually

PAGE = (
    "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{model_name="m"} 3.0\n'
    'vllm:num_requests_waiting{model_name="m"} 1.0\n'
    'vllm:kv_cache_usage_perc{model_name="m"} 0.5\n'
    'vllm:prefix_cache_queries_total{model_name="m"} 10.0\n'
)
CONFIG = ScrapeConfig(interval_ms=20, timeout_ms=100)
HANG = "hang"  # a reply that never comes (until `released` is set)
A, B, C = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"


class FakeTransport:
    """An in-memory `MetricsTransport` and its factory: per address a page, an exception to raise, or HANG."""

    def __init__(self) -> None:
        self.replies: dict[str, str | Exception] = {}
        self.hits: Counter[str] = Counter()
        self.released = asyncio.Event()
        self.made = 0
        self.closed = 0
        self.cancelled = 0

    def __call__(self) -> FakeTransport:
        self.made += 1
        return self

    async def fetch(self, address: str) -> str:
        self.hits[address] += 1
        reply = self.replies.get(address, PAGE)
        if reply == HANG:
            try:
                await self.released.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
            reply = self.replies.get(address, PAGE)
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def close(self) -> None:
        self.closed += 1


def registry_of(*addresses: str) -> EndpointRegistry:
    registry = EndpointRegistry()
    registry.adopt([("pool", list(addresses))])
    return registry


def endpoint(registry: EndpointRegistry, address: str) -> Endpoint:
    return next(ep for ep in registry.endpoints() if ep.address == address)


def scraper_tasks(method: str = "") -> list[asyncio.Task[object]]:
    """Unfinished tasks running a MetricsScraper coroutine (`method`: only that one, e.g. "_scrape")."""
    return [t for t in asyncio.all_tasks()
            if f"MetricsScraper.{method}" in getattr(t.get_coro(), "__qualname__", "")]


async def scrapes_done() -> None:
    """Wait until no scrape is in flight (a round's scrapes run in their own tasks)."""
    await eventually(lambda: not scraper_tasks("_scrape"), "the round's scrapes to finish")


async def no_wait(delay: float) -> None:
    """The stagger offsets pass at once (the rounds are stepped by the test; see the stagger tests)."""


def scraper(registry: EndpointRegistry, transport: FakeTransport, sleep: SteppedSleep,
            config: ScrapeConfig = CONFIG, **kwargs: object) -> MetricsScraper:
    kwargs.setdefault("stagger_sleep", no_wait)
    return MetricsScraper(registry, config, transport=transport, sleep=sleep, **kwargs)  # type: ignore[arg-type]


async def test_scrapes_every_endpoint_each_interval_and_stamps_with_the_injected_clock() -> None:
    transport, sleep = FakeTransport(), SteppedSleep()
    transport.replies[B] = PAGE.replace("3.0", "7.0")
    registry = registry_of(A, B)
    async with scraper(registry, transport, sleep, clock=lambda: 1234.5) as running:
        await sleep.wait_parked()  # the first round runs at once
        await scrapes_done()
        a, b = endpoint(registry, A), endpoint(registry, B)
        assert a.metrics == EndpointMetrics(scraped_at=1234.5, running=3.0, waiting=1.0, kv_usage=0.5,
                                            prefix_queries=10.0)
        assert b.metrics is not None and b.metrics.running == 7.0
        for _ in range(2):
            await sleep.step()
            await scrapes_done()
        assert transport.hits == {A: 3, B: 3}  # one scrape per endpoint per round
        assert a.scrape_failures == 0 and running.failures_total == 0 and running.scrapes_total == 6
    assert 0 < sleep.delays[0] <= 0.02, sleep.delays  # after the first round: the rest of the 20 ms interval
    assert transport.made == 1 and transport.closed == 1


@pytest.mark.parametrize("fault", ["http-500", "timeout", "unreadable"])
async def test_failure_keeps_old_metrics_counts_and_recovers(fault: str) -> None:
    transport, sleep = FakeTransport(), SteppedSleep()
    registry = registry_of(A)
    ep = endpoint(registry, A)
    now = [1.0]
    # A 10 ms timeout: the hanging fetch is given up by the scraper's own timer (the behaviour under test).
    config = ScrapeConfig(interval_ms=20, timeout_ms=10)
    async with scraper(registry, transport, sleep, config, clock=lambda: now[0]) as running:
        await sleep.wait_parked()
        await scrapes_done()
        good = ep.metrics
        assert good is not None
        now[0] = 2.0
        transport.replies[A] = {"http-500": ScrapeFailed("HTTP 500"), "timeout": HANG,
                                "unreadable": ConnectionResetError("reset")}[fault]
        for _ in range(2):
            await sleep.step()
            await scrapes_done()
        assert ep.scrape_failures == 2
        assert ep.metrics is good
        assert running.failures_total >= 2
        transport.replies[A] = PAGE
        transport.released.set()
        await sleep.step()
        await scrapes_done()
        assert ep.scrape_failures == 0
        assert ep.metrics is not None and ep.metrics.scraped_at == 2.0


async def test_refused_connection_counts_failures_without_metrics() -> None:
    transport, sleep = FakeTransport(), SteppedSleep()
    transport.replies[A] = ScrapeFailed("cannot connect: Connection refused")
    registry = registry_of(A)
    ep = registry.endpoints()[0]
    async with scraper(registry, transport, sleep) as running:
        for _ in range(2):
            await sleep.step()
        await scrapes_done()
    assert ep.scrape_failures == 3 and ep.metrics is None
    assert running.failures_total == running.scrapes_total == 3


async def test_a_hanging_endpoint_does_not_delay_the_others() -> None:
    transport, sleep = FakeTransport(), SteppedSleep()
    transport.replies[A] = HANG
    registry = registry_of(A, B)
    async with scraper(registry, transport, sleep, ScrapeConfig(interval_ms=20, timeout_ms=10_000)):
        for _ in range(4):
            await sleep.step()
        await eventually(lambda: transport.hits[B] == 5, "five rounds of the fast endpoint")
        # One scrape in flight per endpoint: the hanging one is not asked again until it answers or times out.
        assert transport.hits[A] == 1
        assert endpoint(registry, A).scrape_failures == 0


async def test_picks_up_registry_changes_between_rounds() -> None:
    transport, sleep = FakeTransport(), SteppedSleep()
    registry = registry_of(A)
    async with scraper(registry, transport, sleep):
        await sleep.wait_parked()
        await scrapes_done()
        assert transport.hits == {A: 1}
        registry.adopt([("pool", [A, B])])
        await sleep.step()
        await scrapes_done()
        assert endpoint(registry, B).metrics is not None and transport.hits == {A: 2, B: 1}
        registry.adopt([("pool", [B])])
        for _ in range(3):
            await sleep.step()
            await scrapes_done()
        assert transport.hits == {A: 2, B: 4}


async def test_stop_cancels_scrapes_in_flight_and_leaves_no_tasks() -> None:
    transport, sleep = FakeTransport(), SteppedSleep()
    transport.replies[A] = HANG
    transport.replies[B] = ScrapeFailed("cannot connect: Connection refused")
    running = scraper(registry_of(A, B), transport, sleep, ScrapeConfig(interval_ms=20, timeout_ms=5000))
    await running.start()
    await running.start()  # idempotent
    await eventually(lambda: transport.hits[A] == 1, "the hanging scrape to start")
    assert running.running and scraper_tasks()
    # The hanging fetch ends only if cancelled (the timeout is 5 s, the release never comes): stop must cancel
    # it rather than wait. The bound only keeps a broken stop from hanging the test run.
    async with asyncio.timeout(5):
        await running.stop()
    assert transport.cancelled == 1
    assert not running.running
    assert scraper_tasks() == []
    assert transport.made == 1 and transport.closed == 1
    await running.stop()  # idempotent
    assert transport.closed == 1


async def test_disabled_scraper_does_nothing() -> None:
    transport, sleep = FakeTransport(), SteppedSleep()
    async with scraper(registry_of(A), transport, sleep, ScrapeConfig(enabled=False, interval_ms=20)) as s:
        assert not s.running and scraper_tasks() == [] and sleep.parked == 0
    assert transport.made == 0 and transport.hits == {} and scraper_tasks() == []


async def test_logs_once_per_state_change_not_per_failure(caplog: pytest.LogCaptureFixture) -> None:
    transport, sleep = FakeTransport(), SteppedSleep()
    transport.replies[A] = ScrapeFailed("HTTP 503")
    registry = registry_of(A)
    ep = registry.endpoints()[0]
    caplog.set_level(logging.INFO, logger="extproc.endpoints.scraper")

    async def rounds(count: int) -> None:
        for _ in range(count):
            await sleep.step()
            await scrapes_done()

    async with scraper(registry, transport, sleep):
        await sleep.wait_parked()
        await rounds(3)
        assert ep.scrape_failures == 4
        transport.replies[A] = PAGE
        await rounds(1)
        assert ep.metrics is not None
        transport.replies[A] = ScrapeFailed("HTTP 500")
        await rounds(3)
        assert ep.scrape_failures == 3
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        f"metrics scrape of {A} failing: HTTP 503",
        f"metrics scrape of {A} recovered",
        f"metrics scrape of {A} failing: HTTP 500",
    ]


async def test_a_timeout_is_logged_with_the_configured_bound(caplog: pytest.LogCaptureFixture) -> None:
    transport, sleep = FakeTransport(), SteppedSleep()
    transport.replies[A] = HANG
    registry = registry_of(A)
    with caplog.at_level(logging.WARNING, logger="extproc.endpoints.scraper"):
        async with scraper(registry, transport, sleep, ScrapeConfig(interval_ms=20, timeout_ms=10)):
            await eventually(lambda: endpoint(registry, A).scrape_failures == 1, "the scrape to time out")
    assert [r.getMessage() for r in caplog.records] == [f"metrics scrape of {A} failing: timed out after 10 ms"]


class FlakyRegistry(EndpointRegistry):
    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def endpoints(self) -> list[Endpoint]:
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("boom")
        return super().endpoints()


async def test_an_error_in_a_round_is_logged_once_and_scraping_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    transport, sleep = FakeTransport(), SteppedSleep()
    registry = FlakyRegistry(failures=3)
    registry.adopt([("pool", [A])])
    with caplog.at_level(logging.ERROR, logger="extproc.endpoints.scraper"):
        async with scraper(registry, transport, sleep):
            for _ in range(3):
                await sleep.step()
            await scrapes_done()
            assert registry.failures == 0 and transport.hits == {A: 1}
    assert [r.getMessage() for r in caplog.records] == ["metrics scrape round failed"]


def test_is_fresh() -> None:
    ep = Endpoint("10.0.0.1:8000")
    assert not is_fresh(ep, 10.0, 1.0)
    ep.metrics = EndpointMetrics(scraped_at=9.0)
    assert is_fresh(ep, 10.0, 1.0)
    assert not is_fresh(ep, 10.5, 1.0)


async def test_hands_each_scrape_to_its_endpoint_with_the_current_rules_and_notifies() -> None:
    transport, sleep = FakeTransport(), SteppedSleep()
    registry = registry_of(A)
    rules: list[SaturationConfig] = []
    notified: list[int] = []

    def saturation() -> SaturationConfig:
        rules.append(SaturationConfig(sustain_ms=0))
        return rules[-1]

    running = scraper(registry, transport, sleep, clock=lambda: 50.0, saturation=saturation)
    running.on_scrape = lambda: notified.append(1)
    ep = endpoint(registry, A)
    lease = ep.lease()
    async with running:
        await sleep.step()
        await scrapes_done()
    lease.release()
    assert ep.metrics is not None and ep.metrics.waiting == 1.0 and ep.in_flight_at_scrape == 1
    assert len(notified) == 2
    assert len(rules) == 2  # read at every scrape: a reload needs no call here


async def test_skips_what_another_replica_scrapes_and_hands_its_own_scrapes_on() -> None:
    transport, sleep = FakeTransport(), SteppedSleep()
    registry = registry_of(A, B)
    running = scraper(registry, transport, sleep, clock=lambda: 7.0)
    running.should_scrape = lambda ep: ep.address == A
    handed: list[tuple[str, float]] = []
    running.on_metrics = lambda ep, metrics: handed.append((ep.address, metrics.running))
    async with running:
        await sleep.wait_parked()
        await scrapes_done()
        await sleep.step()
        await scrapes_done()
    assert transport.hits == {A: 2}
    assert endpoint(registry, B).metrics is None
    assert handed == [(A, 3.0), (A, 3.0)]


async def test_a_scrape_records_every_replicas_in_flight_so_the_others_finished_requests_free_room_at_once() -> None:
    """With several service replicas, the load after a scrape is the scrape plus the change of the replicas'
    in-flight count since: another replica's requests that end there free their seats at its next in-flight
    exchange, not at the next scrape (which, at 0.9x load with 3 replicas, held requests while seats were free)."""
    transport, sleep = FakeTransport(), SteppedSleep()
    transport.replies[A] = PAGE.replace("running{model_name=\"m\"} 3.0", "running{model_name=\"m\"} 7.0").replace(
        "waiting{model_name=\"m\"} 1.0", "waiting{model_name=\"m\"} 0.0")
    registry = registry_of(A)
    ep = endpoint(registry, A)
    lease = ep.lease()
    ep.others(6)  # the engine runs 7: this replica's one and the others' six
    async with scraper(registry, transport, sleep, clock=lambda: 50.0):
        await sleep.wait_parked()
        await scrapes_done()
    assert ep.in_flight_at_scrape == 7
    seats = LoadModel(SaturationConfig(), stale_after_s=1.0, seats=7)
    assert seats.room(ep, 50.01) == 0
    ep.others(4)  # two of the others' requests ended there since the scrape
    assert seats.requests(ep, 50.01) == 5 and seats.room(ep, 50.01) == 2
    lease.release()
    assert seats.room(ep, 50.01) == 3


class ParkedOffsets:
    """A stagger sleep that records each offset and holds its scrape until `release`."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self.gate = asyncio.Event()

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        await self.gate.wait()


async def test_a_rounds_scrapes_start_spread_over_the_first_half_of_the_interval() -> None:
    transport, sleep, offsets = FakeTransport(), SteppedSleep(), ParkedOffsets()
    registry = registry_of(A, B, C, "10.0.0.4:8000")
    async with scraper(registry, transport, sleep, ScrapeConfig(interval_ms=40, timeout_ms=100, stagger=True),
                       stagger_sleep=offsets):
        await sleep.wait_parked()
        await eventually(lambda: len(offsets.delays) == 3, "three scrapes waiting for their offsets")
        # The first endpoint at once, the others at their own place within the first 20 ms of the 40 ms round.
        assert offsets.delays == pytest.approx([0.005, 0.010, 0.015])
        assert transport.hits == {A: 1}
        offsets.gate.set()
        await scrapes_done()
        assert transport.hits == {A: 1, B: 1, C: 1, "10.0.0.4:8000": 1}


async def test_without_stagger_a_round_scrapes_every_endpoint_at_once() -> None:
    transport, sleep, offsets = FakeTransport(), SteppedSleep(), ParkedOffsets()
    registry = registry_of(A, B, C)
    assert not ScrapeConfig().stagger  # the default
    async with scraper(registry, transport, sleep, ScrapeConfig(interval_ms=40, timeout_ms=100),
                       stagger_sleep=offsets):
        await sleep.wait_parked()
        await scrapes_done()
        assert transport.hits == {A: 1, B: 1, C: 1} and offsets.delays == []
