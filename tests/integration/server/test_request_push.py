"""Requests pushed between service replicas as they are routed, through a real redis-server."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from extproc.config.schema import SchedulingConfig
from extproc.limits.resp import Address, RespClient
from extproc.scheduling import Scheduler
from extproc.server.placements import PlacementSync
from extproc.server.request_push import REQUESTS_KEY, RequestPush
from tests.integration.limits.redis_server import RedisServer
from tests.integration.server.test_placements import SYSTEM, prefix_plugin, route
from tests.support import eventually
from tests.unit.scheduling.helpers import NOW, fleet

pytestmark = pytest.mark.integration


def replica(server: RedisServer, name: str, interval_s: float = 30.0) -> tuple[PlacementSync, Scheduler]:
    """A replica whose placement exchange runs every `interval_s` once started (long: what reaches the other replica
    in between came by the push)."""
    scheduler = Scheduler(SchedulingConfig())
    address = Address.from_url(server.url)
    client = RespClient(address, timeout_s=1.0, scripts=PlacementSync.SCRIPTS)
    push = RequestPush(client, RespClient(address, timeout_s=1.5), name, block_s=0.2, retry_s=0.05,
                       clock=lambda: NOW)
    sync = PlacementSync(client, lambda: scheduler, interval_s, replica_id=name, push=push, clock=lambda: NOW)
    return sync, scheduler



async def _more(raw: Redis, entries: int) -> bool:
    return bool(await raw.xlen(REQUESTS_KEY) > entries)


def backlog(scheduler: Scheduler) -> float:
    """(The scheduling clock stands still at NOW: routing, exports and replays all happen then.)"""
    scorer = prefix_plugin(scheduler)
    return max(scorer.backlog.tokens(e.address, NOW) for e in fleet(4))


async def test_a_request_reaches_the_other_replica_before_the_next_exchange(server: RedisServer) -> None:
    (a, sched_a), (b, sched_b) = replica(server, "a"), replica(server, "b")
    try:
        for sync in (a, b):
            await sync.sync_once()  # the server's clock (the loop's first exchange comes after an interval)
            await sync.start()
        route(sched_a, SYSTEM + " first", fleet(4))
        assert b.push is not None and a.push is not None
        push_a, push_b = a.push, b.push

        def replayed() -> bool:
            assert push_b.learned_lines == 1, (f"a pushed {push_a.pushed_lines} lines, {push_a.failures_total} "
                                               f"failures; b {push_b.failures_total} failures")
            return True

        await eventually(replayed, "b replays a's request")
        assert backlog(sched_b) > 0
        assert a.push.pushed_lines == 1 and b.learned_lines == 0  # not by the exchange (next one in 30 s)
        assert a.push.learned_lines == 0  # a skips its own entry
    finally:
        for sync in (a, b):
            await sync.stop()


async def test_pushed_entries_are_checked_and_their_age_counts(server: RedisServer) -> None:
    (a, sched_a), (b, sched_b), (late, sched_late) = (replica(server, name) for name in "abc")
    raw = Redis.from_url(server.url)
    try:
        for sync in (a, b, late):  # (not started: each step by hand)
            await sync.sync_once()  # the server's clock
            assert sync.push is not None
            assert await sync.push.read_once() == 0  # nothing yet (waits block_s); reads from the server's now on
        assert a.push is not None and b.push is not None and late.push is not None
        # Malformed entries (another writer on the shared Redis) are skipped and the reads go on.
        for payload in ("not json", '["a list"]', '{"prefix": [7, "10.0.0.9:8000 abc", "~ 1 2"]}'):
            await raw.xadd(REQUESTS_KEY, {"r": "x", "p": payload})
        await raw.xadd(REQUESTS_KEY, {"r": "x"})
        # A request read late (here: the reader's estimate of the server's clock 2 s ahead) is not replayed.
        late.push.server_offset_s = (late.push.server_offset_s or 0.0) + 2.0
        entries = await raw.xlen(REQUESTS_KEY)
        route(sched_a, SYSTEM + " first", fleet(4))
        await a.push.push_once()  # (posted: written at the end of this event-loop iteration)
        await eventually(lambda: _more(raw, entries), "a's XADD")
        assert await b.push.read_once() == 1 and backlog(sched_b) > 0  # past the bad ones, in one read
        assert await late.push.read_once() == 0 and backlog(sched_late) == 0
        assert 0 < await raw.pttl(REQUESTS_KEY) <= 60_000
    finally:
        await raw.aclose()
        for sync in (a, b, late):
            await sync.stop()


async def test_pushes_resume_after_redis_comes_back(server: RedisServer) -> None:
    (a, sched_a), (b, _) = replica(server, "a", 0.05), replica(server, "b", 0.05)
    try:
        for sync in (a, b):
            await sync.start()
        assert a.push is not None and b.push is not None
        push_a, push_b = a.push, b.push
        await eventually(lambda: push_b.server_offset_s is not None, "the first exchange")
        server.kill()
        route(sched_a, SYSTEM + " lost", fleet(4))  # its line is dropped: stale by the time Redis is back
        await eventually(lambda: push_a.failures_total > 0 and push_b.failures_total > 0, "both notice")
        server.start()
        await eventually(lambda: a.sent_lines > 0, "a exchanges again (the placement kept through the outage)")
        route(sched_a, SYSTEM + " after", fleet(4))
        await eventually(lambda: push_b.learned_lines >= 1, "b replays the request after the outage")
        assert push_b.learned_lines == 1  # not the one routed while Redis was down
    finally:
        for sync in (a, b):
            await sync.stop()
