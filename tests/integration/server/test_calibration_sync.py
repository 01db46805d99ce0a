"""Prompt calibration shared between service replicas through a real redis-server."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from extproc.gateway.calibration import PromptCalibration
from extproc.limits.resp import Address, RespClient
from extproc.server.calibration_sync import CALIBRATION_KEY, CalibrationSync
from tests.integration.limits.redis_server import RedisServer

pytestmark = pytest.mark.integration


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def replica(server: RedisServer, name: str, clock: Clock) -> tuple[CalibrationSync, PromptCalibration]:
    calibration = PromptCalibration(min_samples=20)
    client = RespClient(Address.from_url(server.url), timeout_s=1.0, scripts=CalibrationSync.SCRIPTS)
    return CalibrationSync(client, calibration, 1.0, stale_after_s=5.0, replica_id=name, clock=clock), calibration


async def test_a_replica_without_access_log_entries_estimates_from_the_fleets_fit(server: RedisServer) -> None:
    clock = Clock()
    (a, cal_a), (b, cal_b), (c, cal_c) = (replica(server, name, clock) for name in "abc")
    raw = Redis.from_url(server.url)
    try:
        for estimate in range(10, 40):  # only a receives usage
            cal_a.observe("chat", estimate, 7 + 2 * estimate)
        await raw.hset(CALIBRATION_KEY, "garbage", f"{clock.now:.3f} not-json")
        assert [await sync.sync_once() for sync in (a, b, c)] == [0, 1, 2]  # the garbage field is ignored
        assert cal_a.tokens("chat", 100) == cal_b.tokens("chat", 100) == cal_c.tokens("chat", 100) == 207
        assert cal_b.describe()["chat"]["observations"] == 30
        # a stops publishing: once stale, the others fall back to what they know themselves (nothing)
        clock.now += 6.0
        await b.sync_once()
        assert cal_b.tokens("chat", 100) == 100
        assert set(await raw.hkeys(CALIBRATION_KEY)) == {b"b"}  # stale fields are deleted
    finally:
        for sync in (a, b, c):
            await sync.stop()
        await raw.aclose()
