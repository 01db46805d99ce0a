from __future__ import annotations

import time
from collections.abc import AsyncIterator

import aiohttp
import pytest

from extproc.config.schema import ScrapeConfig
from extproc.endpoints import Endpoint, EndpointRegistry, MetricsScraper
from extproc.endpoints.scraper import is_fresh
from extproc.sim import Fleet, ReplicaSpec, load_profile
from tests.support import eventually

pytestmark = pytest.mark.integration

MODEL = "org/model:8b"
CHAT = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Summarise the plot of a long novel about whales, in detail. " * 8}],
    "max_tokens": 4,
}
CONFIG = ScrapeConfig(interval_ms=20, timeout_ms=300, stale_after_ms=200)


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    profile = load_profile("fast")
    specs = [ReplicaSpec(MODEL, "127.0.0.1", 0, profile, lora_adapters=("sql",)) for _ in range(2)]
    async with Fleet(specs) as running:
        yield running


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


def fresh(endpoint: Endpoint) -> bool:
    return is_fresh(endpoint, time.monotonic(), CONFIG.stale_after_ms / 1000)


async def test_scraper_follows_a_simulated_fleet(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    busy, victim = fleet.replicas
    registry = EndpointRegistry()
    registry.adopt([("chat", [f"127.0.0.1:{busy.port}", f"127.0.0.1:{victim.port}"])])
    by_port = {int(ep.address.rsplit(":", 1)[1]): ep for ep in registry.endpoints()}
    busy_ep, victim_ep = by_port[busy.port], by_port[victim.port]

    async with MetricsScraper(registry, CONFIG) as scraper:
        await eventually(lambda: busy_ep.metrics is not None and victim_ep.metrics is not None,
                         "both replicas scraped")
        assert busy_ep.metrics is not None and victim_ep.metrics is not None
        assert busy_ep.metrics.num_gpu_blocks > 0 and busy_ep.metrics.block_size == 16
        queries_before = busy_ep.metrics.prefix_queries

        async with http.post(busy.url + "/v1/chat/completions", json=CHAT) as resp:
            assert resp.status == 200, await resp.text()
        await eventually(lambda: busy_ep.metrics is not None and busy_ep.metrics.prefix_queries > queries_before,
                         "the busy replica's prefix queries to grow")

        async with http.post(victim.url + "/sim/faults", json={"refuse": True}) as resp:
            assert resp.status == 200
        await eventually(lambda: victim_ep.scrape_failures >= 3, "three failed scrapes of the victim")
        assert victim_ep.metrics is not None  # the last good scrape is kept, and ages
        assert fresh(busy_ep) and busy_ep.scrape_failures == 0
        await eventually(lambda: not fresh(victim_ep), "the victim's metrics to go stale")
        assert fresh(busy_ep)
        assert scraper.failures_total >= 3

        async with http.post(f"{busy.url}/sim/faults?port={victim.port}", json={"refuse": False}) as resp:
            assert resp.status == 200
        await eventually(lambda: victim_ep.scrape_failures == 0 and fresh(victim_ep), "the victim scraped again")
