"""build_store: which store a policy gets, and how the Redis one is wired to the failover."""

from __future__ import annotations

import pytest
import yaml

from extproc.config import parse_policy
from extproc.endpoints import EndpointRegistry
from extproc.gateway.calibration import PromptCalibration
from extproc.limits import MemoryStore
from extproc.limits.cluster import ClusterClient
from extproc.scheduling import Scheduler
from extproc.server.stores import (
    REDIS_URL_ENV,
    build_calibration_sync,
    build_fleet_sync,
    build_placement_sync,
    build_store,
)


def policy(limits: dict[str, object], extproc_endpoints: list[str] | None = None) -> str:
    doc: dict[str, object] = {"pools": [{"name": "p", "model": "m", "endpoints": ["127.0.0.1:9"]}], "limits": limits}
    if extproc_endpoints:
        doc["envoy"] = {"extproc_endpoints": extproc_endpoints}
    return yaml.safe_dump(doc)


def test_memory_store_by_default() -> None:
    store, redis = build_store(parse_policy(policy({}), "p.yaml"))
    assert isinstance(store, MemoryStore) and redis is None


@pytest.mark.parametrize(("limits", "ttl_s"), [
    ({}, 1.0),  # slices by default, for a second
    ({"slice_ttl_ms": 250}, 0.25),
    ({"slices": False}, None),  # every admission waits for Redis
])
async def test_slices_by_default(monkeypatch: pytest.MonkeyPatch, limits: dict[str, object], ttl_s: float | None
                                 ) -> None:
    monkeypatch.delenv(REDIS_URL_ENV, raising=False)
    store, redis = build_store(parse_policy(policy({"store": "redis", "redis_url": "redis://127.0.0.1:1/0",
                                                    **limits}), "p.yaml"))
    try:
        assert redis is not None
        if ttl_s is None:
            assert redis.slices is None
        else:
            assert redis.slices is not None and redis.slices.ttl_s == ttl_s
    finally:
        await store.close()


@pytest.mark.parametrize(("limits", "flow", "interval_s"), [
    ({"store": "redis", "redis_url": "redis://127.0.0.1:1/0"}, {}, 0.01),
    ({"store": "redis", "redis_url": "redis://127.0.0.1:1/0"}, {"fleet_sync_ms": 50}, 0.05),
    ({"store": "redis", "redis_url": "redis://127.0.0.1:1/0"}, {"fleet_sync_ms": 0}, None),
    ({"store": "redis", "redis_url": "redis://127.0.0.1:1/0"}, {"enabled": False}, None),
    ({}, {}, None),  # one replica's memory store: nobody to share with
])
async def test_replicas_share_in_flight_counts_through_the_limits_redis(
        monkeypatch: pytest.MonkeyPatch, limits: dict[str, object], flow: dict[str, object],
        interval_s: float | None) -> None:
    monkeypatch.delenv(REDIS_URL_ENV, raising=False)
    doc = yaml.safe_load(policy(limits))
    doc["flow_control"] = flow
    fleet = build_fleet_sync(parse_policy(yaml.safe_dump(doc), "p.yaml"), EndpointRegistry(), lambda: None)
    if interval_s is None:
        assert fleet is None
    else:
        assert fleet is not None and fleet.interval_s == interval_s
        await fleet.stop()


@pytest.mark.parametrize(("limits", "shared"), [
    ({"store": "redis", "redis_url": "redis://127.0.0.1:1/0"}, True),
    ({"store": "redis", "redis_url": "redis://127.0.0.1:1/0", "calibrate_prompt_tokens": False}, False),
    ({}, False),  # one replica's memory store: nobody to share with
])
async def test_replicas_share_prompt_calibration_through_the_limits_redis(
        monkeypatch: pytest.MonkeyPatch, limits: dict[str, object], shared: bool) -> None:
    monkeypatch.delenv(REDIS_URL_ENV, raising=False)
    sync = build_calibration_sync(parse_policy(policy(limits), "p.yaml"), PromptCalibration())
    assert (sync is not None) == shared
    if sync is not None:
        await sync.stop()


@pytest.mark.parametrize(("limits", "scheduling", "interval_s"), [
    ({"store": "redis", "redis_url": "redis://127.0.0.1:1/0"}, {}, 0.01),
    ({"store": "redis", "redis_url": "redis://127.0.0.1:1/0"}, {"placement_sync_ms": 200}, 0.2),
    ({"store": "redis", "redis_url": "redis://127.0.0.1:1/0"}, {"placement_sync_ms": 0}, None),
    ({}, {}, None),  # one replica's memory store: nobody to share with
])
async def test_replicas_share_prefix_placements_through_the_limits_redis(
        monkeypatch: pytest.MonkeyPatch, limits: dict[str, object], scheduling: dict[str, object],
        interval_s: float | None) -> None:
    monkeypatch.delenv(REDIS_URL_ENV, raising=False)
    doc = yaml.safe_load(policy(limits))
    doc["scheduling"] = scheduling
    policy_ = parse_policy(yaml.safe_dump(doc), "p.yaml")
    sync = build_placement_sync(policy_, lambda: Scheduler(policy_.scheduling))
    if interval_s is None:
        assert sync is None
    else:
        assert sync is not None and sync.interval_s == interval_s
        await sync.stop()


async def test_a_redis_cluster_gets_the_cluster_client_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REDIS_URL_ENV, raising=False)
    limits = {"store": "redis", "redis_url": "redis://127.0.0.1:1/0", "redis_cluster": True}
    parsed = parse_policy(policy(limits), "p.yaml")
    store, redis = build_store(parsed)
    fleet = build_fleet_sync(parsed, EndpointRegistry(), lambda: None)
    sync = build_calibration_sync(parsed, PromptCalibration())
    try:
        assert redis is not None and isinstance(redis._client, ClusterClient)
        assert fleet is not None and isinstance(fleet._client, ClusterClient)
        assert sync is not None and isinstance(sync._client, ClusterClient)
    finally:
        await store.close()
        if fleet is not None:
            await fleet.stop()
        if sync is not None:
            await sync.stop()
