"""Fleet in-flight sync between service replicas through a real redis-server."""

from __future__ import annotations

import dataclasses
import math

import pytest
from redis.asyncio import Redis

from extproc.endpoints import EndpointMetrics, EndpointRegistry
from extproc.endpoints.config import SaturationConfig
from extproc.endpoints.shared_metrics import owner
from extproc.limits import StoreUnavailable
from extproc.limits.resp import Address, RespClient
from extproc.server.fleet import FLEET_KEY, FleetSync, parse_counts
from extproc.server.scrape_share import ScrapeShare
from tests.integration.limits.redis_server import RedisServer
from tests.support import eventually

pytestmark = pytest.mark.integration

ADDRESSES = ("10.0.0.1:8000", "10.0.0.2:8000")


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def replica(server: RedisServer, name: str, clock: Clock, kicks: list[str] | None = None) -> tuple[
        FleetSync, EndpointRegistry]:
    registry = EndpointRegistry()
    registry.adopt([("chat", ADDRESSES)])
    client = RespClient(Address.from_url(server.url), timeout_s=1.0, scripts=FleetSync.SCRIPTS)
    sync = FleetSync(client, registry, 0.02, stale_after_s=1.0, replica_id=name, clock=clock,
                     on_sync=(lambda: kicks.append(name)) if kicks is not None else None)
    return sync, registry


def others(registry: EndpointRegistry) -> list[int]:
    return [ep.others_in_flight for ep in registry.endpoints()]


def test_published_values_parse() -> None:
    assert parse_counts(b"12.5 a:1 3 b:2 0") == (12.5, {"a:1": 3, "b:2": 0})
    assert parse_counts("7") == (7.0, {})
    for bad in ("", "1 a", "x a 1"):
        with pytest.raises(ValueError):
            parse_counts(bad)


async def test_replicas_see_each_others_in_flight_and_forget_a_silent_one(server: RedisServer) -> None:
    clock, kicks = Clock(), list[str]()
    (a, reg_a), (b, reg_b), (c, reg_c) = (replica(server, n, clock, kicks) for n in "abc")
    raw = Redis.from_url(server.url)
    try:
        reg_a.endpoints()[0].in_flight = 3
        reg_b.endpoints()[0].in_flight, reg_b.endpoints()[1].in_flight = 2, 5
        for sync in (a, b, c):
            await sync.sync_once()
        await a.sync_once()
        assert others(reg_a) == [2, 5] and others(reg_b) == [3, 0] and others(reg_c) == [5, 5]
        assert a.replicas == 3 and kicks[-1] == "a"  # queued requests are re-checked after each sync
        await b.sync_once()
        assert (a.slot(), b.slot(), c.slot()) == ((0, 3), (1, 3), (2, 3))  # by replica id, the same in each
        # b stops publishing: once its entry is older than stale_after_s the others drop it, and delete it
        clock.now += 1.5
        for sync in (a, c):
            await sync.sync_once()
        assert others(reg_a) == [0, 0] and others(reg_c) == [3, 0]
        await a.sync_once()
        assert set(await raw.hkeys(FLEET_KEY)) == {b"a", b"c"}
        assert (a.slot(), c.slot()) == ((0, 2), (1, 2))  # b is gone: renumbered without it
        # Redis goes away: the exchange fails, and the last counts age out instead of lingering
        server.kill()
        with pytest.raises(StoreUnavailable):
            await c.sync_once()
        assert others(reg_c) == [3, 0]
        clock.now += 1.5
        await c.start()
        await eventually(lambda: c.failures_total >= 1, "a failed exchange in the background loop")
        assert others(reg_c) == [0, 0] and c.replicas == 1 and c.slot() == (0, 1)
    finally:
        for sync in (a, b, c):
            await sync.stop()
        await raw.aclose()


def sharing(server: RedisServer, name: str, clock: Clock, mono: Clock) -> tuple[FleetSync, EndpointRegistry]:
    registry = EndpointRegistry()
    registry.adopt([("chat", ADDRESSES)])
    client = RespClient(Address.from_url(server.url), timeout_s=1.0, scripts=FleetSync.SCRIPTS)
    share = ScrapeShare(registry, name, fallback_s=0.25, clock=mono)
    return FleetSync(client, registry, 0.02, stale_after_s=1.0, clock=clock, scrapes=share), registry


async def test_each_endpoint_is_scraped_by_one_replica_and_its_scrape_reaches_the_others(
        server: RedisServer) -> None:
    clock, mono = Clock(), Clock()
    mono.now = 50.0
    (a, reg_a), (b, reg_b) = sharing(server, "a", clock, mono), sharing(server, "b", clock, mono)
    assert a.scrapes is not None and b.scrapes is not None
    raw = Redis.from_url(server.url)
    try:
        # Alone (the other not heard from yet) a replica scrapes everything.
        assert all(a.scrapes.should_scrape(ep) for ep in reg_a.endpoints())
        for sync in (a, b, a):
            await sync.sync_once()
        owners = {address: owner(address, ["a", "b"]) for address in ADDRESSES}
        # Until a copy arrives, every replica scrapes (nobody waits on an owner that may never publish).
        assert all(b.scrapes.should_scrape(ep) for ep in reg_b.endpoints())
        # The owner's scrape reaches the other, stamped on its clock by the scrape's age.
        address = ADDRESSES[0]
        sync, registry = (a, reg_a) if owners[address] == "a" else (b, reg_b)
        other, other_registry = (b, reg_b) if sync is a else (a, reg_a)
        assert sync.scrapes is not None and other.scrapes is not None
        scrape = EndpointMetrics(scraped_at=49.99, running=4, waiting=2, kv_usage=0.5,
                                 step_tokens_buckets=((512.0, 1.0), (math.inf, 2.0)))
        target = next(ep for ep in registry.endpoints() if ep.address == address)
        target.scraped(scrape, 0, SaturationConfig())
        sync.scrapes.scraped(target, scrape)
        await sync.sync_once()
        mono.now, clock.now = 50.01, clock.now + 0.01  # read 10 ms after publication
        await other.sync_once()
        got = next(ep for ep in other_registry.endpoints() if ep.address == address)
        assert got.metrics is not None
        assert dataclasses.replace(got.metrics, scraped_at=scrape.scraped_at) == scrape
        assert got.metrics.scraped_at == pytest.approx(49.99, abs=1e-3)
        assert not other.scrapes.should_scrape(got)  # a fresh copy: left to its owner
        assert sync.scrapes.should_scrape(target)  # which goes on scraping it
        await other.sync_once()
        assert other.scrapes.adopted_total == 1  # the same scrape read again is not adopted twice
        # Garbage in the shared hash is ignored.
        await raw.hset(FLEET_KEY, mapping={"x/scrapes": f"{clock.now} not json",
                                           "y/scrapes": f'{clock.now} {{"{address}": [9, "bad"]}}'})
        await other.sync_once()
        assert other.scrapes.adopted_total == 1
        # No copy for longer than the fallback: the other replica scrapes it itself.
        mono.now += 0.3
        assert other.scrapes.should_scrape(got)
    finally:
        for s in (a, b):
            await s.stop()
        await raw.aclose()
