"""Slices against a real redis-server: admissions from a slice wait for nothing and Redis records every one;
another replica's slice counts as used; near a limit every admission is decided in Redis; bursts of
several replicas never admit more than a limit."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable

import pytest
from redis.asyncio import Redis

from extproc.limits import AdmitRequest, ConcurrencyLimit, RedisStore, Reservation, TokenBudget
from extproc.limits._rules import window_index
from extproc.limits.slices import Slices
from tests.integration.limits.redis_server import RedisServer
from tests.support import arrive_after, eventually

pytestmark = pytest.mark.integration

_prefixes = itertools.count()


def budget(limit: int) -> TokenBudget:
    return TokenBudget("{t}:tpm", limit=limit, window_s=60)


def sliced(server: RedisServer, prefix: str, name: str = "a", ttl_s: float = 30.0,
           admit_timeout_ms: float = 2000) -> RedisStore:
    return RedisStore(server.url, prefix=prefix, timeout_ms=2000, admit_timeout_ms=admit_timeout_ms,
                      slices=Slices(name, ttl_s))


def req(rid: str, tokens: int, tpm: TokenBudget, *conc: ConcurrencyLimit) -> AdmitRequest:
    return AdmitRequest(rid, time.time(), tokens, concurrency=conc, budgets=(tpm,))


async def window_tokens(raw: Redis, prefix: str, tpm: TokenBudget) -> int:
    """The tokens the test's admissions charged: each test has its own prefix and lasts under a minute, so they
    are in this minute's window or, when the test crossed a minute boundary, partly or all in the previous one."""
    index = window_index(time.time(), 60)
    values = [await raw.get(f"{prefix}{tpm.key}:tw60:{i}") for i in (index - 1, index)]
    return sum(int(value or 0) for value in values)


def slices(store: RedisStore) -> Slices:
    assert store.slices is not None
    return store.slices


async def warm(store: RedisStore, tpm: TokenBudget, tokens: int, *conc: ConcurrencyLimit) -> None:
    """Two awaited admissions: the second, with two requests of demand, gets a slice."""
    for _ in range(2):
        assert (await store.admit(req(f"warm-{next(_prefixes)}", tokens, tpm, *conc))).admitted


async def test_a_slice_admits_while_redis_is_asleep_and_redis_records_it(servers: Callable[..., RedisServer]) -> None:
    server = servers()
    prefix = f"s{next(_prefixes)}:"
    tpm = budget(10_000)
    store = sliced(server, prefix, admit_timeout_ms=300)
    raw, staller = Redis.from_url(server.url), Redis.from_url(server.url)
    try:
        await warm(store, tpm, 100)
        stall = asyncio.create_task(staller.execute_command("DEBUG", "SLEEP", "1"))  # type: ignore[no-untyped-call]
        await eventually(server.asleep, "the server in DEBUG SLEEP")
        started = time.monotonic()
        fast = await store.admit(req("fast", 100, tpm))
        took = time.monotonic() - started
        assert fast.admitted and took < 0.1, took  # the behaviour: decided here, not after Redis's 1 s sleep
        await stall
        await store.ping()
        assert await window_tokens(raw, prefix, tpm) == 300
        assert (slices(store).local_total, slices(store).awaited_total, slices(store).uncovered_total) == (1, 2, 0)
    finally:
        await store.close()
        await raw.aclose()
        await staller.aclose()


async def test_slice_admissions_take_leases_and_tokens_exactly_and_give_them_back(redis_server: RedisServer) -> None:
    prefix = f"s{next(_prefixes)}:"
    tpm, conc = budget(1_000_000), ConcurrencyLimit("{t}:conc", limit=1000)
    store = sliced(redis_server, prefix)
    raw = Redis.from_url(redis_server.url)
    try:
        await warm(store, tpm, 10, conc)
        local_before = slices(store).local_total
        # demand grows with every request: renewals (awaited) give ever larger slices
        results = await asyncio.gather(*(store.admit(req(f"r{i}", 10, tpm, conc)) for i in range(50)))
        assert all(r.admitted for r in results) and slices(store).local_total > local_before
        await store.ping()
        assert await window_tokens(raw, prefix, tpm) == 520
        assert await raw.zcard(f"{prefix}{conc.key}:cc") == 52
        now = time.time()
        for i in range(50):
            reservation = Reservation(f"r{i}", 10, (conc,), (tpm,), now)
            await store.release(reservation, now)
            await store.settle(reservation, 2, now)
        await store.ping()
        assert await raw.zcard(f"{prefix}{conc.key}:cc") == 2
        assert await window_tokens(raw, prefix, tpm) == 20 + 50 * 2
        assert slices(store).uncovered_total == 0
    finally:
        await store.close()
        await raw.aclose()


async def test_another_replicas_slice_counts_as_used_until_it_expires(redis_server: RedisServer) -> None:
    prefix = f"s{next(_prefixes)}:"
    tpm = budget(1000)
    a, b = sliced(redis_server, prefix, "a", ttl_s=0.3), sliced(redis_server, prefix, "b")
    raw = Redis.from_url(redis_server.url)
    try:
        await warm(a, tpm, 100)  # 800 left; a asks for its demand (200) and gets it (under half of 800)
        claim = await raw.hget(f"{prefix}{tpm.key}:sl", "a")
        assert claim is not None and claim.split()[0] == b"200"
        refused = await b.admit(req("b1", 700, tpm))  # 800 - 200 claimed by a
        assert not refused.admitted and refused.states[0].remaining == 600
        assert (await b.admit(req("b2", 600, tpm))).admitted
        assert (await a.admit(req("a3", 200, tpm))).admitted  # from a's slice, without asking
        assert slices(a).local_total == 1
        await a.ping()
        assert await window_tokens(raw, prefix, tpm) == 1000
        assert not (await b.admit(req("b3", 1, tpm))).admitted
    finally:
        await a.close()
        await b.close()
        await raw.aclose()


async def test_an_unused_slice_comes_back_when_it_expires_or_is_replaced(redis_server: RedisServer) -> None:
    prefix = f"s{next(_prefixes)}:"
    tpm = budget(1000)
    a, b = sliced(redis_server, prefix, "a", ttl_s=0.3), sliced(redis_server, prefix, "b")
    try:
        await warm(a, tpm, 100)  # a holds a slice of 200
        assert not (await b.admit(req("b1", 700, tpm))).admitted
        await asyncio.sleep(0.35)  # the behaviour: a's slice lives 0.3 s in Redis, then expires
        assert (await b.admit(req("b2", 700, tpm))).admitted  # a's slice expired in Redis
        assert (await a.admit(req("a3", 25, tpm))).admitted  # 75 left: half of it is under two requests
        assert slices(a).take(req("a4", 25, tpm)) is None  # so a holds no slice
        assert (await b.admit(req("b3", 75, tpm))).admitted
    finally:
        await a.close()
        await b.close()


async def test_a_recording_without_its_claim_is_still_counted_and_reported(redis_server: RedisServer) -> None:
    prefix = f"s{next(_prefixes)}:"
    tpm = budget(10_000)
    store = sliced(redis_server, prefix)
    raw = Redis.from_url(redis_server.url)
    try:
        await warm(store, tpm, 100)
        await raw.delete(f"{prefix}{tpm.key}:sl")  # as if it had expired
        assert (await store.admit(req("orphan", 100, tpm))).admitted
        await store.ping()
        assert slices(store).uncovered_total == 1 and await window_tokens(raw, prefix, tpm) == 300
        assert (await store.admit(req("next", 100, tpm))).admitted and slices(store).awaited_total == 3
    finally:
        await store.close()
        await raw.aclose()


@pytest.mark.parametrize("tokens", [7, 60])
async def test_three_replicas_bursting_at_three_times_a_budget_never_exceed_it(redis_server: RedisServer,
                                                                               tokens: int) -> None:
    prefix = f"s{next(_prefixes)}:"
    tpm = budget(1000)
    replicas = [sliced(redis_server, prefix, f"r{i}", ttl_s=1.0) for i in range(3)]
    raw = Redis.from_url(redis_server.url)
    try:
        per_replica = 3 * tpm.limit // tokens // 3

        async def one(replica: RedisStore, rid: str, delay_s: float) -> bool:
            await arrive_after(delay_s)  # over ~50 ms
            return (await replica.admit(req(rid, tokens, tpm))).admitted

        for replica in replicas:  # two requests each first: every replica holds a slice when the burst starts
            await warm(replica, tpm, tokens)
        results = await asyncio.gather(*(one(replica, f"{i}-{n}", n * 0.05 / per_replica)
                                         for n in range(per_replica) for i, replica in enumerate(replicas)))
        for replica in replicas:
            await replica.ping()
        admitted = (sum(results) + 2 * len(replicas)) * tokens
        assert admitted == await window_tokens(raw, prefix, tpm)
        assert 0.8 * tpm.limit <= admitted <= tpm.limit  # slices left unused at the end hold the rest
        assert sum(slices(r).local_total for r in replicas) > 0
        assert sum(slices(r).uncovered_total for r in replicas) == 0
    finally:
        for replica in replicas:
            await replica.close()
        await raw.aclose()


async def test_a_burst_up_to_a_concurrency_limit_is_admitted_whole_while_the_slice_is_renewed(
        redis_server: RedisServer) -> None:
    """A renewal's new claim counts as used in Redis before its reply reaches the replica: the requests decided
    meanwhile (keeping the claim) would be refused with the replica's own slice units free. Its reply comes
    first on the connection, so they are admitted from the new slice instead; the limit still holds."""
    prefix = f"s{next(_prefixes)}:"
    tpm, conc = budget(1_000_000), ConcurrencyLimit("{t}:conc", limit=40)
    store = sliced(redis_server, prefix)
    raw = Redis.from_url(redis_server.url)
    try:
        await warm(store, tpm, 1, conc)  # two leases, and a slice
        results = await asyncio.gather(*(store.admit(req(f"r{i}", 1, tpm, conc)) for i in range(38)))
        assert [r.admitted for r in results] == [True] * 38
        assert slices(store).local_total > 0 and slices(store).awaited_total > 2
        assert not (await store.admit(req("one-too-many", 1, tpm, conc))).admitted
        await store.ping()
        assert await raw.zcard(f"{prefix}{conc.key}:cc") == 40
        assert slices(store).uncovered_total == 0
    finally:
        await store.close()
        await raw.aclose()
