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

import aiohttp

from extproc.aio import Sleep
from extproc.endpoints.config import SaturationConfig, ScrapeConfig
from extproc.endpoints.registry import Endpoint, EndpointRegistry
from extproc.endpoints.vllm_metrics import parse_vllm_metrics
from extproc.periodic import FailureLog, Periodic

__all__ = ["MAX_BODY_BYTES", "MetricsScraper", "SessionFactory", "default_session", "is_fresh"]

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 4 * 1024 * 1024  # a vLLM page is ~20-60 KB; anything this large is not one
SessionFactory = Callable[[], aiohttp.ClientSession]


def is_fresh(endpoint: Endpoint, now: float, stale_after_s: float) -> bool:
    """True when the endpoint has metrics scraped at most `stale_after_s` before `now` (same clock)."""
    metrics = endpoint.metrics
    return metrics is not None and now - metrics.scraped_at <= stale_after_s


def default_session() -> aiohttp.ClientSession:
    # One keep-alive connection per endpoint is reused round after round; no pool limit, because a queue
    # for a free connection would eat into every scrape's timeout. Uncompressed: on a LAN, gunzipping
    # every page each 100 ms costs more CPU than the bytes are worth.
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0),
        headers={"Accept": "text/plain", "Accept-Encoding": "identity"},
    )


class _ScrapeFailed(Exception):
    """A response that is not a usable metrics page; the message names the state for the log."""


def _failure_state(exc: BaseException, timeout_ms: int) -> str:
    if isinstance(exc, _ScrapeFailed):
        return str(exc)
    if isinstance(exc, TimeoutError):
        return f"timed out after {timeout_ms} ms"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect: {exc.os_error.strerror or type(exc.os_error).__name__}"
    return f"{type(exc).__name__}: {exc}"


class MetricsScraper:
    """Scrapes `/metrics` of every endpoint in `registry` once per `config.interval_ms`.

    `scrapes_total` counts finished scrape attempts and `failures_total` the failed ones among them. Rounds
    run at a fixed rate (a `Periodic`); `clock` stamps the metrics and `sleep` waits between rounds.
    """

    def __init__(
        self,
        registry: EndpointRegistry,
        config: ScrapeConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        session_factory: SessionFactory = default_session,
        max_body_bytes: int = MAX_BODY_BYTES,
        path: str = "/metrics",
        saturation: Callable[[], SaturationConfig] = SaturationConfig,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        """`saturation`: the current policy's rules, which each scrape is learned by."""
        self._registry = registry
        self._config = config
        self._clock = clock
        self._saturation = saturation
        self.on_scrape: Callable[[], None] | None = None  # called after every successful scrape
        self._session_factory = session_factory
        self._max_body_bytes = max_body_bytes
        self._path = path
        self._timeout_s = config.timeout_ms / 1000.0
        self._session: aiohttp.ClientSession | None = None
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
        self._session = self._session_factory()
        self._rounds.start()

    async def stop(self) -> None:
        """Cancel the rounds and every scrape in flight, then close the HTTP session."""
        if not self._rounds.running:
            return
        await self._rounds.stop()
        scrapes = list(self._scrapes.values())
        self._scrapes.clear()
        self._failing.clear()
        for task in scrapes:
            task.cancel()
        await asyncio.gather(*scrapes, return_exceptions=True)
        session, self._session = self._session, None
        if session is not None:
            await session.close()

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
            failures = self._failing.setdefault(endpoint, FailureLog(f"metrics scrape of {endpoint.address}", log))
            failures.failed(_failure_state(exc, self._config.timeout_ms))
            return
        self.scrapes_total += 1
        endpoint.scraped(metrics, in_flight, self._saturation())
        if self.on_scrape is not None:
            self.on_scrape()
        if endpoint in self._failing:
            self._failing.pop(endpoint).recovered()

    async def _fetch(self, address: str) -> str:
        session = self._session
        if session is None:
            raise _ScrapeFailed("scraper stopped")
        limit = self._max_body_bytes
        async with session.get(f"http://{address}{self._path}", allow_redirects=False) as response:
            if response.status != 200:
                raise _ScrapeFailed(f"HTTP {response.status}")
            if response.content_length is not None and response.content_length > limit:
                raise _ScrapeFailed(f"response larger than {limit} bytes")
            body = bytearray()
            async for chunk in response.content.iter_any():
                body += chunk
                if len(body) > limit:
                    raise _ScrapeFailed(f"response larger than {limit} bytes")
        return body.decode("utf-8", "replace")
