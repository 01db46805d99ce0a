"""Poll every endpoint's vLLM /metrics and hand each good scrape to its endpoint (`Endpoint.scraped`).

One round per interval starts a scrape task for every endpoint of the registry that has none in flight, so a
slow or hanging endpoint only skips its own rounds (bounded by the timeout) and never delays the others. With
`stagger` (off by default) each task first waits its endpoint's offset, the endpoints spread evenly over the first
half of the interval, so that a round's fetches and parses do not all land on the event loop at once.
Endpoints are read from the registry each round: a config reload that adds or removes endpoints takes effect
at the next round. A failure keeps the old metrics; consumers judge them by `scraped_at` (see `is_fresh`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from types import TracebackType

from extproc.aio import Sleep
from extproc.endpoints.config import SaturationConfig, ScrapeConfig
from extproc.endpoints.metrics import EndpointMetrics
from extproc.endpoints.metrics_transport import (
    HttpMetricsTransport,
    MetricsTransport,
    ScrapeFailed,
    TransportFactory,
)
from extproc.endpoints.registry import Endpoint, EndpointRegistry
from extproc.endpoints.vllm_metrics import parse_vllm_metrics
from extproc.periodic import FailureLog, Periodic

__all__ = ["MetricsScraper", "is_fresh"]

log = logging.getLogger(__name__)


def is_fresh(endpoint: Endpoint, now: float, stale_after_s: float) -> bool:
    """True when the endpoint has metrics scraped at most `stale_after_s` before `now` (same clock)."""
    metrics = endpoint.metrics
    return metrics is not None and now - metrics.scraped_at <= stale_after_s


def _failure_state(exc: BaseException, timeout_ms: int) -> str:
    if isinstance(exc, ScrapeFailed):
        return str(exc)
    if isinstance(exc, TimeoutError):
        return f"timed out after {timeout_ms} ms"
    return f"{type(exc).__name__}: {exc}"


class MetricsScraper:
    """Scrapes `/metrics` of every endpoint in `registry` once per `config.interval_ms`.

    `scrapes_total` counts finished scrape attempts and `failures_total` the failed ones among them. Rounds
    run at a fixed rate (a `Periodic`); `transport` makes the page fetcher at start (HTTP by default), `clock`
    stamps the metrics and `sleep` waits between rounds (all injectable: tests need neither sockets nor real time).
    """

    def __init__(
        self,
        registry: EndpointRegistry,
        config: ScrapeConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        transport: TransportFactory = HttpMetricsTransport,
        saturation: Callable[[], SaturationConfig] = SaturationConfig,
        sleep: Sleep = asyncio.sleep,
        stagger_sleep: Sleep = asyncio.sleep,
    ) -> None:
        """`saturation`: the current policy's rules, which each scrape is learned by; `stagger_sleep` waits an
        endpoint's offset within the round."""
        self._registry = registry
        self._config = config
        self._clock = clock
        self._saturation = saturation
        self.on_scrape: Callable[[], None] | None = None  # called after every successful scrape
        # Called with each good scrape of this process (before `on_scrape`): the fleet exchange publishes it.
        self.on_metrics: Callable[[Endpoint, EndpointMetrics], None] | None = None
        # Asked before each scrape: False skips the endpoint this round (another replica scrapes it for us).
        self.should_scrape: Callable[[Endpoint], bool] | None = None
        self._transport_factory = transport
        self._timeout_s = config.timeout_ms / 1000.0
        self._stagger_sleep = stagger_sleep
        # The offsets span this much of each interval, leaving the other half for the last endpoint's fetch.
        self._spread_s = config.interval_ms / 2000.0 if config.stagger else 0.0
        self._transport: MetricsTransport | None = None
        self._rounds = Periodic("vllm-metrics-scraper", self._start_round, config.interval_ms / 1000.0, log=log,
                                what="metrics scrape round", immediate=True, fixed_rate=True, sleep=sleep)
        self._scrapes: dict[Endpoint, asyncio.Task[None]] = {}  # Endpoint hashes by identity
        self._failing: dict[Endpoint, FailureLog] = {}  # endpoints whose last scrape failed
        self.scrapes_total = 0
        self.failures_total = 0

    @property
    def running(self) -> bool:
        return self._rounds.running

    async def start(self) -> None:
        """Start scraping (the first round at once); no-op when disabled or already running."""
        if not self._config.enabled or self._rounds.running:
            return
        self._transport = self._transport_factory()
        self._rounds.start()

    async def stop(self) -> None:
        """Cancel the rounds and every scrape in flight, then close the transport."""
        if not self._rounds.running:
            return
        await self._rounds.stop()
        scrapes = list(self._scrapes.values())
        self._scrapes.clear()
        self._failing.clear()
        for task in scrapes:
            task.cancel()
        await asyncio.gather(*scrapes, return_exceptions=True)
        transport, self._transport = self._transport, None
        if transport is not None:
            await transport.close()

    async def __aenter__(self) -> MetricsScraper:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _start_round(self) -> None:
        endpoints = self._registry.endpoints()
        current = set(endpoints)
        for gone in [ep for ep in self._scrapes if ep not in current]:
            self._scrapes.pop(gone).cancel()
        for gone in [ep for ep in self._failing if ep not in current]:
            del self._failing[gone]
        step = self._spread_s / len(endpoints) if endpoints else 0.0
        for index, endpoint in enumerate(endpoints):
            task = self._scrapes.get(endpoint)
            if task is not None and not task.done():
                continue  # still waiting on a slow endpoint: it skips this round, the others do not wait
            if self.should_scrape is not None and not self.should_scrape(endpoint):
                continue
            self._scrapes[endpoint] = asyncio.create_task(self._scrape(endpoint, index * step))

    async def _scrape(self, endpoint: Endpoint, offset_s: float = 0.0) -> None:
        if offset_s > 0:
            await self._stagger_sleep(offset_s)  # its place in the round (cancelled with the task on stop)
        in_flight = endpoint.fleet_in_flight
        try:
            async with asyncio.timeout(self._timeout_s):
                text = await self._fetch(endpoint.address)
            metrics = parse_vllm_metrics(text, self._clock())
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.scrapes_total += 1
            self.failures_total += 1
            endpoint.scrape_failed()
            failures = self._failing.setdefault(endpoint, FailureLog(f"metrics scrape of {endpoint.address}", log))
            failures.failed(_failure_state(exc, self._config.timeout_ms))
            return
        self.scrapes_total += 1
        endpoint.scraped(metrics, in_flight, self._saturation())
        if self.on_metrics is not None:
            self.on_metrics(endpoint, metrics)
        if self.on_scrape is not None:
            self.on_scrape()
        if endpoint in self._failing:
            self._failing.pop(endpoint).recovered()

    async def _fetch(self, address: str) -> str:
        transport = self._transport
        if transport is None:
            raise ScrapeFailed("scraper stopped")
        return await transport.fetch(address)
