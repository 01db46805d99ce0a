"""Build the limit store a policy asks for (memory, or Redis with a failure policy), and what the replicas
exchange through the same Redis (in-flight counts, prompt calibration, prefix placements)."""

from __future__ import annotations

import os
from collections.abc import Callable

from extproc.config import Policy
from extproc.endpoints import EndpointRegistry
from extproc.gateway.calibration import PromptCalibration
from extproc.limits.failover import FailoverStore
from extproc.limits.headroom import Headroom
from extproc.limits.memory import MemoryStore
from extproc.limits.redis_store import RedisStore
from extproc.limits.resp import Address, RespClient
from extproc.limits.types import Store
from extproc.scheduling import Scheduler
from extproc.server.calibration_sync import CalibrationSync
from extproc.server.fleet import FleetSync
from extproc.server.placements import PlacementSync

REDIS_URL_ENV = "EXTPROC_REDIS_URL"
OPTIMISTIC_SHARE = 0.5  # of 1 / replicas: how far each replica may run ahead of Redis's last reply


def _redis_url(policy: Policy) -> str | None:
    return os.environ.get(REDIS_URL_ENV) or policy.limits.redis_url


def build_store(policy: Policy) -> tuple[Store, RedisStore | None]:
    """The store admission uses, and the Redis client behind it (to warm up at start), if any.

    With Redis, fail-open decides locally with this replica's share (1 / replicas) of every limit, and
    optimistic admission (unless turned off) runs ahead of Redis by at most half that share of what it reported left.
    """
    limits = policy.limits
    if limits.store == "memory":
        return MemoryStore(), None
    url = _redis_url(policy)
    if not url:
        raise ValueError(f"limits.store is redis but neither limits.redis_url nor ${REDIS_URL_ENV} is set")
    replicas = limits.replicas or max(1, len(policy.envoy.extproc_endpoints))
    # Half of its share: what the replicas have in flight together stays under half of what Redis last
    # reported left, so a burst the others admit meanwhile rarely leaves none of it (see the README).
    headroom = Headroom(share=OPTIMISTIC_SHARE / replicas, max_age_s=limits.optimistic_max_age_ms / 1000.0) \
        if limits.optimistic_admission else None
    # The Redis client enforces the decision deadline itself, on the admission's reply (see FailoverStore).
    redis = RedisStore(url, admit_timeout_ms=limits.decision_deadline_ms, headroom=headroom)
    # Redis bounds every call itself (the admission deadline on the reply, the rest by its client
    # timeout; release and settle do not wait for replies), so the failover adds no timers of its own.
    store = FailoverStore(redis, MemoryStore(), limits.on_store_failure, deadline_ms=None,
                          cleanup_deadline_ms=None, fallback_share=1.0 / replicas)
    redis.on_posted_failure = store.record_failure
    return store, redis


def build_fleet_sync(policy: Policy, endpoints: EndpointRegistry, on_sync: Callable[[], None]) -> FleetSync | None:
    """The in-flight exchange between service replicas (flow control), when Redis is the limits store."""
    flow = policy.flow_control
    url = _redis_url(policy)
    if not url or not policy.exchanges_in_flight():
        return None
    interval_s = flow.fleet_sync_ms / 1000.0
    client = RespClient(Address.from_url(url), timeout_s=max(0.05, interval_s), scripts=FleetSync.SCRIPTS)
    return FleetSync(client, endpoints, interval_s, on_sync=on_sync)


def build_calibration_sync(policy: Policy, calibration: PromptCalibration) -> CalibrationSync | None:
    """Prompt calibration shared by the service replicas, when Redis is the limits store."""
    url = _redis_url(policy)
    if policy.limits.store != "redis" or not url or not policy.limits.calibrate_prompt_tokens:
        return None
    client = RespClient(Address.from_url(url), timeout_s=1.0, scripts=CalibrationSync.SCRIPTS)
    return CalibrationSync(client, calibration)


def build_placement_sync(policy: Policy, scheduler: Callable[[], Scheduler]) -> PlacementSync | None:
    """Prefix placements shared by the service replicas, when Redis is the limits store."""
    url = _redis_url(policy)
    if not url or not policy.shares_placements():
        return None
    interval_s = policy.scheduling.placement_sync_ms / 1000.0
    client = RespClient(Address.from_url(url), timeout_s=max(0.1, interval_s), scripts=PlacementSync.SCRIPTS)
    return PlacementSync(client, scheduler, interval_s)
