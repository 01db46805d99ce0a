"""Random traffic through MemoryStore and RedisStore side by side: every answer must be the same."""

from __future__ import annotations

import random

import pytest

from extproc.limits import (
    AdmitRequest,
    AdmitResult,
    ConcurrencyLimit,
    MemoryStore,
    RateLimit,
    Reservation,
    TokenBudget,
)
from tests.integration.limits.conftest import redis_store
from tests.integration.limits.redis_server import RedisServer

pytestmark = pytest.mark.integration

T0 = 1_699_920_000.0


def same(a: AdmitResult, b: AdmitResult) -> bool:
    if (a.admitted, a.refused_by, len(a.states)) != (b.admitted, b.refused_by, len(b.states)):
        return False
    if a.retry_after_s != pytest.approx(b.retry_after_s, abs=1e-9):
        return False
    return all((x.name, x.key, x.limit, x.remaining) == (y.name, y.key, y.limit, y.remaining)
               and x.reset_s == pytest.approx(y.reset_s, abs=1e-9) for x, y in zip(a.states, b.states, strict=True))


async def test_memory_and_redis_agree_on_random_traffic(redis_server: RedisServer) -> None:
    rng = random.Random(11)
    memory, redis = MemoryStore(), redis_store(redis_server, prefix="diff:")
    tenants = ["{a}", "{b}"]
    limits = {t: (RateLimit(f"{t}:rps", rate=1.0, burst=2.0), ConcurrencyLimit(f"{t}:cc", 2, lease_ttl_s=5.0),
                  TokenBudget(f"{t}:tpm", 3000, 60), TokenBudget(f"{t}:tpd", 7000, 86400)) for t in tenants}
    held: list[tuple[Reservation, bool]] = []  # (reservation, settled)
    outcomes: dict[str, int] = {}
    now = T0 + 3.7
    try:
        for i in range(600):
            now += rng.expovariate(4.0)
            action = rng.random()
            if action < 0.25 and held:
                reservation, settled = held.pop(rng.randrange(len(held)))
                await memory.release(reservation, now)
                await redis.release(reservation, now)
                if not settled:
                    actual = rng.randint(0, 600)
                    await memory.settle(reservation, actual, now)
                    await redis.settle(reservation, actual, now)
                continue
            rps, cc, tpm, tpd = limits[rng.choice(tenants)]
            request = AdmitRequest(f"r{i}", now, rng.randint(0, 400), rates=(rps,), concurrency=(cc,),
                                   budgets=(tpm, tpd) if rng.random() < 0.8 else ())
            expected, got = await memory.admit(request), await redis.admit(request)
            assert same(expected, got), (i, request, expected, got)
            outcomes[got.refused_by or "admitted"] = outcomes.get(got.refused_by or "admitted", 0) + 1
            if got.admitted:
                reservation = Reservation(request.request_id, request.tokens, request.concurrency, request.budgets,
                                          now)
                if rng.random() < 0.3:  # settled before release (streamed usage known at the end)
                    actual = rng.randint(0, 600)
                    await memory.settle(reservation, actual, now)
                    await redis.settle(reservation, actual, now)
                    held.append((reservation, True))
                else:
                    held.append((reservation, False))
        # the traffic reached every outcome, so the comparison covered each path
        reached = {k.split(":")[0] for k in outcomes}
        assert reached >= {"admitted", "requests", "concurrency", "tokens", "tokens-day"}, sorted(outcomes.items())
    finally:
        await redis.close()
