"""The replicas' admission-queue lengths for the autoscaler, exchanged through a real redis-server, and the scaler
reporting the fleet's held requests (not only its own replica's)."""

from __future__ import annotations

import pytest

from extproc.config import parse_policy
from extproc.endpoints.health import HealthTracker
from extproc.flow import FlowController, Room
from extproc.gateway.runtime import RuntimeHolder
from extproc.limits import StoreUnavailable
from extproc.limits.resp import Address, RespClient
from extproc.server.queue_sync import QueueSync
from extproc.server.scaler import ScalerService
from tests.integration.limits.redis_server import RedisServer

pytestmark = pytest.mark.integration


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def replica(server: RedisServer, name: str, clock: Clock, queued: dict[str, int]) -> QueueSync:
    client = RespClient(Address.from_url(server.url), timeout_s=1.0, scripts=QueueSync.SCRIPTS)
    return QueueSync(client, lambda: queued, 1.0, stale_after_s=3.0, replica_id=name, clock=clock)


async def test_replicas_see_each_others_queues_and_forget_a_silent_one(server: RedisServer) -> None:
    clock = Clock()
    queues = {"a": {"chat": 2}, "b": {"chat": 5, "embed": 1}, "c": {}}
    a, b, c = (replica(server, name, clock, queues[name]) for name in "abc")
    try:
        for sync in (a, b, c):
            await sync.sync_once()
        await a.sync_once()
        assert (a.others("chat"), a.others("embed"), c.others("chat"), b.others("chat")) == (5, 1, 7, 2)
        queues["b"]["chat"] = 0  # b's queue drained: it stops publishing the pool
        clock.now += 1.0
        await b.sync_once()
        await a.sync_once()
        assert a.others("chat") == 0 and a.others("embed") == 1
        clock.now += 3.5  # b and c silent past stale_after_s: counted out
        assert a.others("embed") == 0
        server.kill()
        with pytest.raises(StoreUnavailable):
            await a.sync_once()
        assert a.others("embed") == 0
    finally:
        for sync in (a, b, c):
            await sync.stop()


async def test_the_scaler_counts_the_other_replicas_held_requests() -> None:
    policy = parse_policy("autoscaling: {enabled: true, allow_unauthenticated: true, predict_s: 0,"
                          " scale_down_stabilization_s: 0}\n"
                          "pools: [{name: chat, model: m, endpoints: ['127.0.0.1:9'], cold_start_timeout_s: 30}]\n")
    runtimes = RuntimeHolder(policy)
    flow = FlowController(lambda: policy.flow_control, lambda pool, now, reserve, enough: Room(0.0, 0, 30.0))
    scaler = ScalerService(runtimes, flow, HealthTracker(lambda: policy.health))
    scaler.sample()
    assert not scaler.active("chat")
    scaler.others = lambda pool: 4 if pool == "chat" else 0  # another replica holds four requests
    assert scaler.active("chat")
    scaler.sample()
    estimate = scaler.tracker.estimate("chat")
    assert estimate is not None and (estimate.demand, estimate.held, estimate.value) == (4.0, 4, 4.0)
