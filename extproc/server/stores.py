"""Build the limit store a policy asks for (memory, or Redis with a failure policy), and what the replicas
exchange through the same Redis (in-flight counts, prompt calibration)."""

from __future__ import annotations

import os
from collections.abc import Callable

from extproc.config import Policy
from extproc.endpoints import EndpointRegistry
from extproc.gateway.calibration import PromptCalibration
from extproc.limits.cluster import redis_client
from extproc.limits.failover import FailoverStore
from extproc.limits.memory import MemoryStore
from extproc.limits.redis_store import RedisStore
from extproc.limits.slices import Slices
from extproc.limits.types import Store
from extproc.server.calibration_sync import CalibrationSync
from extproc.server.fleet import FleetSync, replica_name

REDIS_URL_ENV = "EXTPROC_REDIS_URL"


def _redis_url(policy: Policy) -> str | None:
    return os.environ.get(REDIS_URL_ENV) or policy.limits.redis_url


def build_store(policy: Policy) -> tuple[Store, RedisStore | None]:
    """The store admission uses, and the Redis client behind it (to warm up at start), if any.

    With Redis, each replica admits within its slices of the busy limits without waiting (unless
    `limits.slices` is off), and fail-open decides locally with its share (1 / replicas) of every limit.
    """
    limits = policy.limits
    if limits.store == "memory":
        return MemoryStore(), None
    url = _redis_url(policy)
    if not url:
        raise ValueError(f"limits.store is redis but neither limits.redis_url nor ${REDIS_URL_ENV} is set")
    replicas = limits.replicas or max(1, len(policy.envoy.extproc_endpoints))
    slices = Slices(replica_name(), limits.slice_ttl_ms / 1000.0) if limits.slices else None
    # The Redis client enforces the decision deadline itself, on the admission's reply (see FailoverStore).
    redis = RedisStore(url, admit_timeout_ms=limits.decision_deadline_ms, slices=slices, cluster=limits.redis_cluster)
    # Redis bounds every call itself (the admission deadline on the reply, the rest by its client
    # timeout; release and settle do not wait for replies), so the failover adds no timers of its own.
    store = FailoverStore(redis, MemoryStore(), limits.on_store_failure, fallback_share=1.0 / replicas)
    redis.on_posted_failure = store.record_failure
    return store, redis


def build_fleet_sync(policy: Policy, endpoints: EndpointRegistry, on_sync: Callable[[], None]) -> FleetSync | None:
    """The in-flight exchange between service replicas (flow control), when Redis is the limits store."""
    flow = policy.flow_control
    url = _redis_url(policy)
    if not url or not policy.exchanges_in_flight():
        return None
    interval_s = flow.fleet_sync_ms / 1000.0
    client = redis_client(url, cluster=policy.limits.redis_cluster, timeout_s=max(0.05, interval_s),
                          scripts=FleetSync.SCRIPTS)
    return FleetSync(client, endpoints, interval_s, on_sync=on_sync)


def build_calibration_sync(policy: Policy, calibration: PromptCalibration) -> CalibrationSync | None:
    """Prompt calibration shared by the service replicas, when Redis is the limits store."""
    url = _redis_url(policy)
    if policy.limits.store != "redis" or not url or not policy.limits.calibrate_prompt_tokens:
        return None
    client = redis_client(url, cluster=policy.limits.redis_cluster, timeout_s=1.0, scripts=CalibrationSync.SCRIPTS)
    return CalibrationSync(client, calibration)
