"""Poll every endpoint's vLLM /metrics and hand each good scrape to its endpoint (`Endpoint.scraped`).

One round per interval starts a scrape task for every endpoint of the registry that has none in flight, so a
slow or hanging endpoint only skips its own rounds (bounded by the timeout) and never delays the others.
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
from extproc.config.schema import SaturationConfig, ScrapeConfig
from extproc.endpoints.metrics_transport import (
    HttpMetricsTransport,
    MetricsTransport,
    ScrapeFailed,
    TransportFactory,
)
from extproc.endpoints.registry import Endpoint, EndpointRegistry
from extproc.endpoints.vllm_metrics import parse_vllm_metrics

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

    `scrapes_total` counts finished scrape attempts and `failures_total` the failed ones among them.
    `transport` makes the page fetcher at start (HTTP by default); `clock` stamps the metrics and `sleep`
    waits between rounds (both injectable, so tests need neither sockets nor real time).
    """

    def __init__(
        self,
        registry: EndpointRegistry,
        config: ScrapeConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        transport: TransportFactory = HttpMetricsTransport,
        sleep: Sleep = asyncio.sleep,
        saturation: Callable[[], SaturationConfig] = SaturationConfig,
    ) -> None:
        """`saturation`: the current policy's rules, which each scrape is learned by."""
        self._registry = registry
        self._config = config
        self._clock = clock
        self._saturation = saturation
        self.on_scrape: Callable[[], None] | None = None  # called after every successful scrape
        self._transport_factory = transport
        self._sleep = sleep
        self._timeout_s = config.timeout_ms / 1000.0
        self._transport: MetricsTransport | None = None
        self._round_task: asyncio.Task[None] | None = None
        self._scrapes: dict[Endpoint, asyncio.Task[None]] = {}  # Endpoint hashes by identity
        self._failing: dict[Endpoint, str] = {}  # endpoint -> failure state last logged
        self._round_error_logged = False
        self.scrapes_total = 0
        self.failures_total = 0

    @property
    def running(self) -> bool:
        return self._round_task is not None

    async def start(self) -> None:
        """Start scraping (the first round at once); no-op when disabled or already running."""
        if not self._config.enabled or self._round_task is not None:
            return
        self._transport = self._transport_factory()
        self._round_task = asyncio.create_task(self._rounds(), name="vllm-metrics-scraper")

    async def stop(self) -> None:
        """Cancel the rounds and every scrape in flight, then close the transport."""
        round_task, self._round_task = self._round_task, None
        if round_task is None:
            return
        round_task.cancel()
        scrapes = list(self._scrapes.values())
        self._scrapes.clear()
        self._failing.clear()
        for task in scrapes:
            task.cancel()
        await asyncio.gather(round_task, *scrapes, return_exceptions=True)
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

    async def _rounds(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self._config.interval_ms / 1000.0
        due = loop.time()
        while True:
            try:
                self._start_round()
                self._round_error_logged = False
            except Exception:  # a bug here must not end scraping for good; log it once, not every round
                if not self._round_error_logged:
                    self._round_error_logged = True
                    log.exception("metrics scrape round failed")
            due += interval
            now = loop.time()
            if due < now:  # the loop was blocked for more than a round: skip the missed ones, no burst
                due = now
            await self._sleep(due - now)

    def _start_round(self) -> None:
        endpoints = self._registry.endpoints()
        current = set(endpoints)
        for gone in [ep for ep in self._scrapes if ep not in current]:
            self._scrapes.pop(gone).cancel()
        for gone in [ep for ep in self._failing if ep not in current]:
            del self._failing[gone]
        for endpoint in endpoints:
            task = self._scrapes.get(endpoint)
            if task is not None and not task.done():
                continue  # still waiting on a slow endpoint: it skips this round, the others do not wait
            self._scrapes[endpoint] = asyncio.create_task(self._scrape(endpoint))

    async def _scrape(self, endpoint: Endpoint) -> None:
        in_flight = endpoint.in_flight
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
            state = _failure_state(exc, self._config.timeout_ms)
            if self._failing.get(endpoint) != state:
                self._failing[endpoint] = state
                log.warning("metrics scrape of %s failing: %s", endpoint.address, state)
            return
        self.scrapes_total += 1
        endpoint.scraped(metrics, in_flight, self._saturation())
        if self.on_scrape is not None:
            self.on_scrape()
        if self._failing.pop(endpoint, None) is not None:
            log.info("metrics scrape of %s recovered", endpoint.address)

    async def _fetch(self, address: str) -> str:
        transport = self._transport
        if transport is None:
            raise ScrapeFailed("scraper stopped")
        return await transport.fetch(address)
