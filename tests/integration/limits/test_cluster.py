"""The limits store on a real Redis Cluster (3 primaries + 3 replicas): every command routed to the primary
serving its tenant's slot, exact across replicas; a slot migrated under load followed through ASK then
MOVED (calls and posted commands); a primary killed, its replica promoted, and admissions back in Redis.
The rollout store shares the client, so it works on a cluster too."""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from collections.abc import Iterator

import pytest

from extproc.limits import (
    AdmitRequest,
    ConcurrencyLimit,
    FailoverStore,
    MemoryStore,
    RedisStore,
    Reservation,
    StoreTimeout,
    StoreUnavailable,
)
from extproc.limits import TokenBudget as Budget
from extproc.limits._rules import window_index
from extproc.limits.cluster import key_slot, redis_client
from extproc.limits.resp import Script
from extproc.limits.slices import Slices
from extproc.rollout import PoolWindow, RedisRolloutStore, RolloutState
from tests.integration.limits.redis_cluster import RedisCluster
from tests.support import arrive_after, eventually

pytestmark = pytest.mark.integration

_tenants = itertools.count()


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    made = RedisCluster().start()
    try:
        yield made
    finally:
        made.stop()


def tenants_on(cluster: RedisCluster, count: int, distinct: bool = True) -> list[str]:
    """Hash tags of fresh tenants, on `count` different primaries."""
    found: dict[int, str] = {}
    while len(found) < count:
        tag = f"{{c{next(_tenants)}}}"
        found.setdefault(cluster.owner(key_slot(tag)), tag)
    return list(found.values())


def store(cluster: RedisCluster, name: str, slices: bool = True) -> RedisStore:
    return RedisStore(cluster.url, prefix="lim:", timeout_ms=2000, cluster=True,
                      slices=Slices(name, 1.0) if slices else None)


def counted(cluster: RedisCluster, tag: str) -> int:
    """Tokens in the tenant's current and previous minute windows (read by redis-py's own cluster client;
    a test may cross a minute boundary)."""
    index = window_index(time.time(), 60)
    with cluster.reader() as reader:
        return sum(int(reader.get(f"lim:{tag}:tpm:tw60:{i}") or 0) for i in (index - 1, index))


def leases(cluster: RedisCluster, tag: str) -> int:
    with cluster.reader() as reader:
        return int(reader.zcard(f"lim:{tag}:cc:cc"))


def req(rid: str, tag: str, tokens: int, limit: int = 3000, conc: int = 0) -> AdmitRequest:
    cc = (ConcurrencyLimit(f"{tag}:cc", conc),) if conc else ()
    return AdmitRequest(rid, time.time(), tokens, concurrency=cc, budgets=(Budget(f"{tag}:tpm", limit, 60),))


async def test_tenants_on_different_primaries_are_exact_across_replicas(cluster: RedisCluster) -> None:
    tags = tenants_on(cluster, 2)
    replicas = [store(cluster, f"r{i}") for i in range(3)]
    try:
        async def one(replica: RedisStore, rid: str, tag: str, delay_s: float) -> bool:
            await arrive_after(delay_s)
            return (await replica.admit(req(rid, tag, 10))).admitted

        for replica in replicas:  # two requests each: busy keys, so every replica holds slices
            for tag in tags:
                for n in range(2):
                    assert (await replica.admit(req(f"warm-{id(replica)}-{tag}-{n}", tag, 10))).admitted
        results = await asyncio.gather(*(one(replica, f"{tag}-{i}-{n}", tag, n * 0.001)
                                         for n in range(300) for i, replica in enumerate(replicas) for tag in tags))
        for replica in replicas:
            await replica.ping()
        for k, tag in enumerate(tags):  # each tenant offered 3x its 3,000 tokens
            admitted = 60 + 10 * sum(results[k::len(tags)])
            assert admitted == counted(cluster, tag) and 2400 <= admitted <= 3000  # unused slices: the rest
        assert sum(r.slices.local_total for r in replicas if r.slices is not None) > 0
        assert all(r.posted_failures == {} for r in replicas)
    finally:
        for replica in replicas:
            await replica.close()


async def test_a_migrating_slot_is_followed_through_ask_then_moved(cluster: RedisCluster) -> None:
    tag = tenants_on(cluster, 1)[0]
    slot = key_slot(tag)
    source = cluster.owner(slot)
    target = next(p for p in cluster.primaries() if p != source)
    client = store(cluster, "m", slices=False)
    try:
        first = req("before", tag, 100, conc=5)
        assert (await client.admit(first)).admitted and counted(cluster, tag) == 100
        with cluster.node(source) as src, cluster.node(target) as dst:
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", cluster.node_id(source))  # type: ignore[no-untyped-call]
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", cluster.node_id(target))  # type: ignore[no-untyped-call]
            keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)  # type: ignore[no-untyped-call]
            src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)  # type: ignore[no-untyped-call]
            # The keys are on the target, the slot still the source's: the source answers ASK, and the target
            # runs what finds all its keys there (a call, the posted release and settle) after ASKING; an
            # admission, which creates keys, is refused until the slot has moved (TRYAGAIN: decided alone).
            window = f"lim:{tag}:tpm:tw60:{window_index(time.time(), 60)}"
            assert await client._client.call("GET", window) == b"100"
            with pytest.raises(StoreTimeout, match="TRYAGAIN"):
                await client.admit(req("during", tag, 100, conc=5))
            await client.release(Reservation.of(first), time.time())
            await client.settle(Reservation.of(first), 40, time.time())
            await client.ping()
            for port in cluster.primaries():
                with cluster.node(port) as node:
                    node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", cluster.node_id(target))  # type: ignore[no-untyped-call]
        cluster.wait(lambda: cluster.owner(slot, ask=source) == target, "the slot moved")
        assert (await client.admit(req("moved", tag, 100, conc=5))).admitted  # MOVED: followed, then remembered
        assert (await client.admit(req("again", tag, 100, conc=5))).admitted
        # the release and the settle (100 -> 40) reached the target through ASK
        assert counted(cluster, tag) == 240 and leases(cluster, tag) == 2
        assert client.posted_failures == {}
    finally:
        await client.close()


async def test_a_primary_fails_over_and_admissions_return_to_redis(cluster: RedisCluster) -> None:
    tag = tenants_on(cluster, 1)[0]
    slot = key_slot(tag)
    primary = cluster.owner(slot)
    failover = FailoverStore(store(cluster, "f", slices=False), MemoryStore(), "fail-open", probe_backoff_s=0.2)
    try:
        for i in range(3):
            assert (await failover.admit(req(f"up-{i}", tag, 100))).admitted
        with cluster.node(primary) as node:  # replication is one stream: once this write is on the replica, all are
            node.set(f"{tag}:written", 1)
            assert node.execute_command("WAIT", 1, 5000) == 1  # type: ignore[no-untyped-call]
        victim = cluster.server(primary)
        assert victim.proc is not None
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(timeout=5)
        victim.proc = None
        assert (await failover.admit(req("down", tag, 100))).admitted and not failover.primary_up  # fail-open
        cluster.wait(lambda: cluster.owner(slot) != primary and all(
            cluster.healthy(s.port) for s in cluster.servers if s.proc is not None), "failed over")

        async def back_on_redis() -> bool:  # each probe admission may be the one that finds Redis back
            await failover.admit(req(f"probe-{time.monotonic()}", tag, 1))
            return failover.primary_up

        await eventually(back_on_redis, "admissions going to Redis again", timeout_s=10, interval_s=0.1)
        assert (await failover.admit(req("after", tag, 100))).admitted and failover.primary_up
        assert counted(cluster, tag) >= 400  # 300 before the kill (replicated), 100 after, and the probes
    finally:
        await failover.close()


async def test_rollout_state_lives_on_the_cluster_too(cluster: RedisCluster) -> None:
    """The rollout store talks through the same client: its keys (no hash tag) land on every primary, and each
    command follows its key's slot (redis-py's single-node client got MOVED for most of them)."""
    models = {}
    for n in itertools.count():
        models.setdefault(cluster.owner(key_slot(f"rollout:m{n}")), f"m{n}")
        if len(models) == 3:
            break
    writer = RedisRolloutStore(cluster.url, cluster=True, timeout_ms=2000)
    reader = RedisRolloutStore(cluster.url, cluster=True, timeout_ms=2000)
    try:
        window = PoolWindow()
        window.record(True, 0.1, 0.02)
        for model in models.values():
            state = RolloutState(model, "v2", "v1", 0, 5.0, "running", "started", 1.0, 1.0, 1, 1)
            assert await writer.save(state, 0) and not await reader.save(state, 0)
            await writer.add_outcomes(model, 1, {"v2": window})
            assert await reader.load(model) == state
            assert (await reader.load_outcomes(model, 1))["v2"].requests == 1
            await writer.delete(model)
            assert await reader.load(model) is None
    finally:
        await writer.close()
        await reader.close()


async def test_a_batch_of_scripts_follows_each_first_keys_slot(cluster: RedisCluster) -> None:
    """The replicas' exchanges write their script calls together (`evalsha_batch`); on a cluster each goes to its
    key's primary (the fleet hash and the placements stream hash to different slots)."""
    keys: dict[str, str] = {}
    for n in itertools.count():
        keys.setdefault(cluster.owner(key_slot(f"batch:{n}")), f"batch:{n}")
        if len(keys) == 3:
            break
    client = redis_client(cluster.url, cluster=True, timeout_s=2.0, scripts=(_WHERE,))
    try:
        calls = [(_WHERE, [key], [key]) for key in keys.values()]
        replies = await client.evalsha_batch([*calls, (_REFUSE, ["batch:0"], [])])
        assert replies[:3] == [[key.encode(), key.encode()] for key in keys.values()]
        assert isinstance(replies[3], StoreUnavailable)
    finally:
        await client.close()


_WHERE = Script("redis.call('SET', KEYS[1], ARGV[1]) return {KEYS[1], redis.call('GET', KEYS[1])}")
_REFUSE = Script("return redis.error_reply('ERR refused')")
