"""Fleet in-flight sync between service replicas through a real redis-server."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from extproc.endpoints import EndpointRegistry
from extproc.limits import StoreUnavailable
from extproc.limits.resp import Address, RespClient
from extproc.server.fleet import FLEET_KEY, FleetSync, parse_counts
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
        # b stops publishing: once its entry is older than stale_after_s the others drop it, and delete it
        clock.now += 1.5
        for sync in (a, c):
            await sync.sync_once()
        assert others(reg_a) == [0, 0] and others(reg_c) == [3, 0]
        await a.sync_once()
        assert set(await raw.hkeys(FLEET_KEY)) == {b"a", b"c"}
        # Redis goes away: the exchange fails, and the last counts age out instead of lingering
        server.kill()
        with pytest.raises(StoreUnavailable):
            await c.sync_once()
        assert others(reg_c) == [3, 0]
        clock.now += 1.5
        await c.start()
        await eventually(lambda: c.failures_total >= 1, "a failed exchange in the background loop")
        assert others(reg_c) == [0, 0] and c.replicas == 1
    finally:
        for sync in (a, b, c):
            await sync.stop()
        await raw.aclose()
