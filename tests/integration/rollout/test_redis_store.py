"""RedisRolloutStore against a real redis-server: CAS, pooled outcomes, replicas, restarts, outages."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from extproc.rollout import (
    MemoryRolloutStore,
    PoolWindow,
    RedisRolloutStore,
    Rollouts,
    RolloutState,
    RolloutStore,
    RolloutStoreUnavailable,
)
from tests.integration.limits.redis_server import RedisServer
from tests.integration.rollout.conftest import redis_rollout_store
from tests.support import free_ports
from tests.unit.rollout.traffic import MODEL, FakeClock, PoolHealth, Traffic, split

pytestmark = pytest.mark.integration

HEALTHY = {"v1": PoolHealth(error_rate=0.005), "v2": PoolHealth(error_rate=0.005)}


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest, redis_server: RedisServer, prefix: str) -> AsyncIterator[RolloutStore]:
    made: RolloutStore = MemoryRolloutStore() if request.param == "memory" else redis_rollout_store(
        redis_server, prefix)
    try:
        yield made
    finally:
        await made.close()


def state(version: int = 1, weight: float = 5.0) -> RolloutState:
    return RolloutState(MODEL, "v2", "v1", 0, weight, "running", "started", 10.0, 10.0, 1, version)


async def test_contract_compare_and_set(store: RolloutStore) -> None:
    assert await store.load(MODEL) is None
    assert not await store.save(state(), expected_version=1)
    assert await store.save(state(), expected_version=0)
    assert not await store.save(state(), expected_version=0)
    assert await store.save(state(2, 25.0), expected_version=1)
    assert not await store.save(state(2, 50.0), expected_version=1)
    assert await store.load(MODEL) == state(2, 25.0)


async def test_contract_outcomes_pool_across_writers(store: RolloutStore) -> None:
    a = PoolWindow()
    for i in range(10):
        a.record(i % 5 != 0, 0.1 + i / 100, 0.02)
    await store.add_outcomes(MODEL, 4, {"v2": a, "v1": a})
    await store.add_outcomes(MODEL, 4, {"v2": a})
    pooled = await store.load_outcomes(MODEL, 4)
    assert pooled["v2"].requests == 20 and pooled["v2"].errors == 4 and pooled["v1"].requests == 10
    assert pooled["v2"].ttft.buckets == {k: 2 * v for k, v in a.ttft.buckets.items()}
    assert pooled["v2"].ttft.total == pytest.approx(2 * a.ttft.total)
    assert await store.load_outcomes(MODEL, 5) == {}


async def test_outcome_keys_expire(redis_server: RedisServer, prefix: str) -> None:
    store = RedisRolloutStore(redis_server.url, prefix=prefix, outcomes_ttl_s=600)
    raw = Redis.from_url(redis_server.url)
    try:
        window = PoolWindow()
        window.record(True, 0.1, None)
        await store.add_outcomes(MODEL, 1, {"v2": window})
        assert 590 < await raw.ttl(f"{prefix}{MODEL}:o:1") <= 600
        await store.save(state(), 0)
        assert await raw.ttl(f"{prefix}{MODEL}") == -1  # the state itself never expires
    finally:
        await store.close()
        await raw.aclose()


async def test_three_replicas_walk_a_healthy_canary_to_promoted(redis_server: RedisServer, prefix: str) -> None:
    clock = FakeClock()
    stores = [redis_rollout_store(redis_server, prefix) for _ in range(3)]
    replicas = [Rollouts(s, [split()], clock=clock) for s in stores]
    try:
        for replica in replicas:
            await replica.refresh()
        traffic = Traffic(dict(HEALTHY))
        transitions: list[RolloutState] = []
        for _ in range(600):
            traffic.second(replicas)
            clock.advance(1.0)
            # Replicas tick concurrently: their store calls interleave on the network.
            for made in await asyncio.gather(*(replica.tick() for replica in replicas)):
                transitions += made
            current = replicas[0].state(MODEL)
            if current is not None and current.status == "promoted":
                break
        assert [s.weight for s in transitions] == [25.0, 50.0, 100.0]
        assert [s.version for s in transitions] == [2, 3, 4]
        for replica in replicas:
            await replica.refresh()
            assert replica.current_weights(MODEL) == {"v1": 0.0, "v2": 1.0}
    finally:
        for s in stores:
            await s.close()


async def test_degraded_canary_rolled_back_and_state_survives_restart(redis_server: RedisServer,
                                                                      prefix: str) -> None:
    clock = FakeClock()
    store = redis_rollout_store(redis_server, prefix)
    rollouts = Rollouts(store, [split()], clock=clock)
    await rollouts.refresh()
    traffic = Traffic({"v1": PoolHealth(error_rate=0.005), "v2": PoolHealth(error_rate=0.2)})
    for _ in range(300):
        traffic.second([rollouts])
        clock.advance(1.0)
        await rollouts.tick()
        current = rollouts.state(MODEL)
        if current is not None and current.status != "running":
            break
    await store.close()
    # A new process: new client, new controller, same Redis.
    restarted_store = redis_rollout_store(redis_server, prefix)
    restarted = Rollouts(restarted_store, [split()], clock=clock)
    try:
        await restarted.start()
        state = restarted.state(MODEL)
        assert state is not None and state.status == "rolled_back" and "error rate" in state.reason
        assert restarted.current_weights(MODEL) == {"v1": 1.0, "v2": 0.0}
    finally:
        await restarted.stop()
        await restarted_store.close()


async def test_unreachable_redis_raises_store_unavailable_quickly() -> None:
    port = free_ports(1)[0]
    store = RedisRolloutStore(f"redis://127.0.0.1:{port}", timeout_ms=300)
    rollouts = Rollouts(store, [split()], clock=FakeClock())
    try:
        started = time.monotonic()
        with pytest.raises(RolloutStoreUnavailable):
            await store.load(MODEL)
        await rollouts.start()  # logs, never raises
        assert time.monotonic() - started < 3.0  # bounded by timeout_ms=300 (the behaviour), with a wide margin
        assert not rollouts.store_ok
        assert rollouts.current_weights(MODEL) == {"v1": 1.0, "v2": 0.0}  # baseline only until known
    finally:
        await rollouts.stop()
        await store.close()
