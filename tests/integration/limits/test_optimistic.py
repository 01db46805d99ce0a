"""Optimistic admission (RedisStore with a Headroom) against a real redis-server: no wait while Redis
has room, every forced admission accounted in Redis, waits near a limit, overshoot bounded and counted."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable

import pytest
from redis.asyncio import Redis

from extproc.limits import AdmitRequest, ConcurrencyLimit, RedisStore, Reservation, StoreUnavailable, TokenBudget
from extproc.limits._rules import window_index
from extproc.limits.headroom import Headroom
from tests.integration.limits.redis_server import RedisServer

pytestmark = pytest.mark.integration

_prefixes = itertools.count()


def budget(limit: int) -> TokenBudget:
    return TokenBudget("{t}:tpm", limit=limit, window_s=60)


def optimistic(server: RedisServer, prefix: str, share: float = 1.0, admit_timeout_ms: float = 2000) -> RedisStore:
    return RedisStore(server.url, prefix=prefix, timeout_ms=2000, admit_timeout_ms=admit_timeout_ms,
                      headroom=Headroom(share=share, max_age_s=30))


def req(rid: str, tokens: int, tpm: TokenBudget, *conc: ConcurrencyLimit) -> AdmitRequest:
    return AdmitRequest(rid, time.time(), tokens, concurrency=conc, budgets=(tpm,))


async def window_tokens(raw: Redis, prefix: str, tpm: TokenBudget) -> int:
    value = await raw.get(f"{prefix}{tpm.key}:tw60:{window_index(time.time(), 60)}")
    return int(value or 0)


def headroom(store: RedisStore) -> Headroom:
    assert store.headroom is not None
    return store.headroom


async def test_admits_without_waiting_while_redis_is_asleep_and_redis_accounts_it(
        servers: Callable[..., RedisServer]) -> None:
    server = servers()
    prefix = f"o{next(_prefixes)}:"
    tpm = budget(10_000)
    store = optimistic(server, prefix, admit_timeout_ms=300)
    raw, staller = Redis.from_url(server.url), Redis.from_url(server.url)
    try:
        assert (await store.admit(req("warm", 100, tpm))).admitted  # first contact: decided by Redis
        stall = asyncio.create_task(staller.execute_command("DEBUG", "SLEEP", "1"))  # type: ignore[no-untyped-call]
        await asyncio.sleep(0.05)
        started = time.monotonic()
        fast = await store.admit(req("fast", 100, tpm))
        took = time.monotonic() - started
        assert fast.admitted and took < 0.1, took
        assert [(s.name, s.remaining) for s in fast.states] == [("tokens", 9800.0)]
        # a request that does not fit this replica's headroom waits for Redis (asleep: the deadline)
        with pytest.raises(StoreUnavailable):
            await store.admit(req("big", 9_850, tpm))
        await stall
        await store.ping()
        await asyncio.sleep(0.1)  # the abandoned "big" admission is undone in the background
        assert await window_tokens(raw, prefix, tpm) == 200
        assert (headroom(store).optimistic_total, headroom(store).awaited_total) == (1, 2)
    finally:
        await store.close()
        await raw.aclose()
        await staller.aclose()


async def test_forced_admissions_take_leases_and_tokens_exactly(redis_server: RedisServer) -> None:
    prefix = f"o{next(_prefixes)}:"
    tpm, conc = budget(1_000_000), ConcurrencyLimit("{t}:conc", limit=1000)
    store = optimistic(redis_server, prefix)
    raw = Redis.from_url(redis_server.url)
    try:
        assert (await store.admit(req("first", 10, tpm, conc))).admitted
        results = await asyncio.gather(*(store.admit(req(f"r{i}", 10, tpm, conc)) for i in range(50)))
        assert all(r.admitted for r in results) and headroom(store).optimistic_total == 50
        await store.ping()
        assert await window_tokens(raw, prefix, tpm) == 510
        assert await raw.zcard(f"{prefix}{conc.key}:cc") == 51
        now = time.time()
        for i in range(50):
            reservation = Reservation(f"r{i}", 10, (conc,), (tpm,), now)
            await store.release(reservation, now)
            await store.settle(reservation, 2, now)
        await store.ping()
        assert await raw.zcard(f"{prefix}{conc.key}:cc") == 1
        assert await window_tokens(raw, prefix, tpm) == 10 + 50 * 2
        assert headroom(store).overshoots_total == 0
    finally:
        await store.close()
        await raw.aclose()


async def test_each_replica_runs_ahead_only_by_its_share_then_waits_for_redis(redis_server: RedisServer) -> None:
    prefix = f"o{next(_prefixes)}:"
    tpm = budget(1000)
    a, b = optimistic(redis_server, prefix, share=0.5), optimistic(redis_server, prefix, share=0.5)
    raw = Redis.from_url(redis_server.url)
    try:
        assert (await a.admit(req("a1", 100, tpm))).admitted  # a: 900 left
        assert (await b.admit(req("b1", 800, tpm))).admitted  # b: 100 left
        refused = await a.admit(req("a2", 500, tpm))  # 500 > 900 / 2: a asks Redis, which has 100
        assert not refused.admitted and headroom(a).awaited_total == 2
        assert (await a.admit(req("a3", 50, tpm))).admitted  # 50 <= 100 / 2: without waiting
        assert headroom(a).optimistic_total == 1
        await a.ping()
        assert not (await a.admit(req("a4", 60, tpm))).admitted  # 50 left: waits, refused
        assert await window_tokens(raw, prefix, tpm) == 950
        assert headroom(a).overshoots_total == 0
    finally:
        await a.close()
        await b.close()
        await raw.aclose()


async def test_an_overshoot_from_a_stale_report_is_accounted_counted_and_stops_there(
        redis_server: RedisServer) -> None:
    """Two replicas each configured as if alone (share 1): the one with the older report runs over."""
    prefix = f"o{next(_prefixes)}:"
    tpm = budget(1000)
    a, b = optimistic(redis_server, prefix), optimistic(redis_server, prefix)
    raw = Redis.from_url(redis_server.url)
    try:
        assert (await a.admit(req("a1", 100, tpm))).admitted  # a: 900 left
        assert (await b.admit(req("b1", 800, tpm))).admitted  # really 100 left
        assert (await a.admit(req("a2", 300, tpm))).admitted  # a's report still says 900
        await a.ping()
        assert headroom(a).overshoots_total == 1
        assert await window_tokens(raw, prefix, tpm) == 1200  # Redis counted every token
        late = await a.admit(req("a3", 1, tpm))  # a's report now says 0 left: waits, refused
        assert not late.admitted and late.refused_by == "tokens:{t}:tpm"
    finally:
        await a.close()
        await b.close()
        await raw.aclose()
