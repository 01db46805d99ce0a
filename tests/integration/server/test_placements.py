"""Prefix placements shared between service replicas through a real redis-server."""

from __future__ import annotations

import json

import pytest
from redis.asyncio import Redis

from extproc.config.schema import SchedulingConfig
from extproc.endpoints import Endpoint, EndpointRegistry
from extproc.limits import StoreUnavailable
from extproc.limits.resp import Address, RespClient
from extproc.scheduling import Scheduler
from extproc.scheduling.plugins.prefix_affinity import PrefixAffinityScorer
from extproc.server.fleet import FleetSync
from extproc.server.placements import PLACEMENTS_KEY, PlacementSync
from tests.integration.limits.redis_server import RedisServer
from tests.unit.scheduling.helpers import NOW, fleet, request

pytestmark = pytest.mark.integration

SYSTEM = "You are the assistant of a shop. " + "Answer politely and briefly. " * 60


def replica(server: RedisServer, name: str, slot: tuple[int, int] | None = None) -> tuple[PlacementSync, Scheduler]:
    scheduler = Scheduler(SchedulingConfig())
    client = RespClient(Address.from_url(server.url), timeout_s=1.0, scripts=PlacementSync.SCRIPTS)
    return PlacementSync(client, lambda: scheduler, 0.02, replica_id=name,
                         slot=(lambda: slot) if slot is not None else None, clock=lambda: NOW), scheduler


def prefix_plugin(scheduler: Scheduler) -> PrefixAffinityScorer:
    plugin = scheduler.shared()["prefix"]
    assert isinstance(plugin, PrefixAffinityScorer)
    return plugin


def route(scheduler: Scheduler, prompt: str, endpoints: list[Endpoint]) -> Endpoint:
    scheduling = request(prompt)
    picked = scheduler.schedule("default", scheduling, endpoints, 1)[0]
    scheduler.profile("default").observe(scheduling, picked)
    return picked


async def test_a_replica_follows_what_another_placed_and_a_late_starter_catches_up(server: RedisServer) -> None:
    (a, sched_a), (b, sched_b) = replica(server, "a"), replica(server, "b")
    endpoints = fleet(8)
    try:
        for sync in (a, b):
            await sync.sync_once()  # both start recording their placements
        conversation = SYSTEM + " user: where is my order? " * 20
        follow_up = conversation + " assistant: on its way " * 10 + " user: when?"
        alone = endpoints[prefix_plugin(sched_b).score(request(follow_up), endpoints).index(1.0)]
        alone.in_flight = 5  # a places it elsewhere than an idle fleet's first choice, b alone would not
        placed = route(sched_a, conversation, endpoints)
        alone.in_flight = 0
        assert placed is not alone
        await a.sync_once()
        await b.sync_once()
        assert a.sent_lines == 2 and b.learned_lines == 2  # the placement, and the request b replays
        assert route(sched_b, follow_up, endpoints) is placed
        await b.sync_once()
        await a.sync_once()  # a reads b's placement, never its own
        assert a.learned_lines == 2
        late, sched_late = replica(server, "late")
        await late.sync_once()
        assert late.learned_lines == 4 and route(sched_late, follow_up + " more", endpoints) is placed
        raw = Redis.from_url(server.url)
        try:
            assert await raw.xlen(PLACEMENTS_KEY) == 2 and await raw.pttl(PLACEMENTS_KEY) > 0
            # Entries another writer corrupted are skipped, and the exchange goes on.
            await raw.xadd(PLACEMENTS_KEY, {"r": "x", "p": "not json"})
            await raw.xadd(PLACEMENTS_KEY, {"r": "x", "p": '{"prefix": ["10.0.0.9:8000 abc", 7]}'})
            await late.sync_once()
            assert late.learned_lines == 4
        finally:
            await raw.aclose()
    finally:
        for sync in (a, b):
            await sync.stop()


async def test_placements_wait_for_redis_when_it_is_down(server: RedisServer) -> None:
    (a, sched_a), (b, sched_b) = replica(server, "a"), replica(server, "b")
    endpoints = fleet(4)
    try:
        await a.sync_once()
        await b.sync_once()
        placed = route(sched_a, SYSTEM + " first", endpoints)
        server.kill()
        with pytest.raises(StoreUnavailable):
            await a.sync_once()
        assert a.sent_lines == 0  # the placement kept for the next exchange
        server.start()
        await a.sync_once()
        await b.sync_once()
        # Only the placement: the request's line was dropped with the failed exchange (its age was fixed when it
        # was exported, so after the outage b would have replayed a backlog long gone as fresh).
        assert a.sent_lines == 1 and b.learned_lines == 1
        assert all(prefix_plugin(sched_b).backlog.tokens(e.address, NOW) == 0 for e in endpoints)
        endpoints[endpoints.index(placed)].in_flight = 2  # b alone would now place it elsewhere
        assert route(sched_b, SYSTEM + " second", endpoints) is placed
    finally:
        for sync in (a, b):
            await sync.stop()


async def test_each_exchange_tells_the_plugins_their_replicas_share_of_endpoints(server: RedisServer) -> None:
    endpoints = fleet(8)
    prompts = [SYSTEM + f" variant {n}" for n in range(8)]
    (first, sched_first), (second, sched_second) = replica(server, "a", (0, 2)), replica(server, "b", (1, 2))
    alone, sched_alone = replica(server, "c")
    try:
        for sync in (first, second, alone):
            await sync.sync_once()
        # A new prefix on an idle fleet: on an endpoint dealt to the replica (addresses in order, in turn), where
        # alone it goes by rank, to either half.
        assert {route(sched_first, p, fleet(8)).address for p in prompts} <= {e.address for e in endpoints[0::2]}
        assert {route(sched_second, p, fleet(8)).address for p in prompts} <= {e.address for e in endpoints[1::2]}
        by_rank = {endpoints.index(next(e for e in endpoints if e.address == route(sched_alone, p, fleet(8)).address))
                   % 2 for p in prompts}
        assert by_rank == {0, 1}
    finally:
        for sync in (first, second, alone):
            await sync.stop()


async def test_a_request_is_replayed_only_while_young_on_the_redis_servers_clock(server: RedisServer) -> None:
    """An entry's age is the server's time since it was added (its id), whatever the replicas' clocks say: a
    replica reading an old entry learns its placement but does not replay its request (its backlog is long gone)."""
    endpoints = fleet(2)
    (a, sched_a), (b, sched_b) = replica(server, "a"), replica(server, "b")
    try:
        await a.sync_once()
        route(sched_a, SYSTEM + " first", endpoints)
        lines = prefix_plugin(sched_a).export_shared(NOW) + prefix_plugin(sched_a).export_perishable(NOW)
        assert [line[0] for line in lines] == ["1", "~"]  # a placement, a request
        raw = Redis.from_url(server.url)
        try:
            await raw.xadd(PLACEMENTS_KEY, {"r": "old", "p": json.dumps({"prefix": lines})}, id="1000-0")
            await b.sync_once()
            assert b.learned_lines == 1  # the placement
            scorer = prefix_plugin(sched_b)
            assert all(scorer.backlog.tokens(e.address, NOW) == 0 for e in endpoints)
            await raw.xadd(PLACEMENTS_KEY, {"r": "new", "p": json.dumps({"prefix": lines})})
            await b.sync_once()
            assert b.learned_lines == 3  # now both
            assert max(scorer.backlog.tokens(e.address, NOW) for e in endpoints) > 0
        finally:
            await raw.aclose()
    finally:
        for sync in (a, b):
            await sync.stop()


async def test_carried_by_the_in_flight_exchange_the_placements_go_in_its_write(server: RedisServer) -> None:
    """The service's default: the in-flight exchange carries the placement exchange, both script calls in one
    write on the in-flight exchange's connection (the placements' script is not loaded there: NOSCRIPT, EVAL)."""
    rounds = []
    for name in ("a", "b"):
        placements, scheduler = replica(server, name)
        registry = EndpointRegistry()
        registry.adopt([("chat", [e.address for e in fleet(8)])])
        in_flight = FleetSync(RespClient(Address.from_url(server.url), timeout_s=1.0, scripts=FleetSync.SCRIPTS),
                              registry, 0.02, replica_id=name)
        in_flight.carry(placements)
        rounds.append((in_flight, placements, scheduler, registry))
    (fleet_a, placed_a, sched_a, reg_a), (fleet_b, placed_b, sched_b, reg_b) = rounds
    endpoints = fleet(8)
    try:
        for sync in (fleet_a, fleet_b):
            assert await sync.run_round()  # both start recording their placements
        conversation = SYSTEM + " user: where is my order? " * 20
        home = route(sched_a, conversation, endpoints)
        reg_a.endpoints()[3].in_flight = 2
        assert await fleet_a.run_round() and await fleet_b.run_round()
        assert placed_a.sent_lines == 2 and placed_b.learned_lines == 2  # the placement, the request replayed
        assert [e.others_in_flight for e in reg_b.endpoints()][3] == 2  # and the in-flight counts, same write
        assert route(sched_b, conversation + " assistant: soon. user: when?", endpoints) is home
        assert placed_a._client._conn is None and placed_b._client._conn is None  # their own never connected
        assert placed_a.failures_total == fleet_a.failures_total == 0
    finally:
        for in_flight, placements, _, _ in rounds:
            await in_flight.stop()
            await placements.stop()
