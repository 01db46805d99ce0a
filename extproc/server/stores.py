"""Build what a policy keeps in Redis, each over its own connection with the same address, credentials and TLS
(`redis_settings`): the limit store (memory, or Redis with a failure policy), what the replicas exchange (in-flight
counts, prompt calibration, prefix placements), and the rollout state."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from extproc.config import Policy
from extproc.endpoints import EndpointRegistry
from extproc.endpoints.config import SaturationConfig
from extproc.gateway.calibration import PromptCalibration
from extproc.limits.cluster import RedisClient, redis_client
from extproc.limits.failover import FailoverStore
from extproc.limits.memory import MemoryStore
from extproc.limits.redis_address import Address, RedisTls
from extproc.limits.redis_store import RedisStore
from extproc.limits.resp import Script
from extproc.limits.slices import Slices
from extproc.limits.types import Store
from extproc.rollout.redis_store import RedisRolloutStore
from extproc.rollout.state import MemoryRolloutStore, RolloutStore
from extproc.scheduling import Scheduler
from extproc.server.calibration_sync import CalibrationSync
from extproc.server.fleet import FleetSync, replica_name
from extproc.server.placements import PlacementSync
from extproc.server.queue_sync import QueueSync
from extproc.server.request_push import RequestPush
from extproc.server.scrape_share import ScrapeShare

_PUSH_BLOCK_S = 1.0  # the longest a pushed-requests read waits for an entry

REDIS_URL_ENV = "EXTPROC_REDIS_URL"


@dataclass(frozen=True, slots=True)
class RedisSettings:
    """Where every Redis connection of the service goes (`limits.*`; `$EXTPROC_REDIS_URL` wins over the URL)."""

    url: str
    cluster: bool
    tls: RedisTls | None

    def client(self, timeout_s: float, scripts: Sequence[Script] = ()) -> RedisClient:
        return redis_client(self.url, cluster=self.cluster, timeout_s=timeout_s, scripts=scripts, tls=self.tls)


def redis_settings(policy: Policy) -> RedisSettings | None:
    """The policy's Redis (None with `limits.store: memory`). Raises ValueError when `limits.store` is redis but no
    URL is set, or the URL (from the environment: the policy's own was checked at load) is not one we can use."""
    limits = policy.limits
    if limits.store != "redis":
        return None
    url = os.environ.get(REDIS_URL_ENV) or limits.redis_url
    if not url:
        raise ValueError(f"limits.store is redis but neither limits.redis_url nor ${REDIS_URL_ENV} is set")
    Address.from_url(url, limits.redis_tls)  # a URL we cannot use fails the start now, with its reason
    return RedisSettings(url, limits.redis_cluster, limits.redis_tls)


def build_store(policy: Policy) -> tuple[Store, RedisStore | None]:
    """The store admission uses, and the Redis client behind it (to warm up at start), if any.

    With Redis, each replica admits within its slices of the busy limits without waiting (unless
    `limits.slices` is off), and fail-open decides locally with its share (1 / replicas) of every limit.
    """
    limits = policy.limits
    redis_at = redis_settings(policy)
    if redis_at is None:
        return MemoryStore(), None
    replicas = limits.replicas or max(1, len(policy.envoy.extproc_endpoints))
    slices = Slices(replica_name(), limits.slice_ttl_ms / 1000.0) if limits.slices else None
    # The Redis client enforces the decision deadline itself, on the admission's reply (see FailoverStore).
    redis = RedisStore(redis_at.url, admit_timeout_ms=limits.decision_deadline_ms, slices=slices,
                       cluster=redis_at.cluster, tls=redis_at.tls)
    # Redis bounds every call itself (the admission deadline on the reply, the rest by its client
    # timeout; release and settle do not wait for replies), so the failover adds no timers of its own.
    store = FailoverStore(redis, MemoryStore(), limits.on_store_failure, fallback_share=1.0 / replicas)
    redis.on_posted_failure = store.record_failure
    return store, redis


def build_fleet_sync(policy: Policy, endpoints: EndpointRegistry, on_sync: Callable[[], None],
                     saturation: Callable[[], SaturationConfig] = SaturationConfig) -> FleetSync | None:
    """The in-flight exchange between service replicas (flow control), when Redis is the limits store; it
    shares the endpoints' scrapes too (`scheduling.scrape.share`)."""
    redis_at = redis_settings(policy)
    if redis_at is None or not policy.exchanges_in_flight():
        return None
    interval_s = policy.flow_control.fleet_sync_ms / 1000.0
    scrape = policy.scheduling.scrape
    scrapes = None
    if scrape.enabled and scrape.share:
        # A copy is at most a scrape interval plus two exchanges old; two of each before scraping oneself.
        fallback_s = 2.0 * (scrape.interval_ms / 1000.0 + interval_s)
        scrapes = ScrapeShare(endpoints, replica_name(), fallback_s, saturation=saturation)
    return FleetSync(redis_at.client(max(0.05, interval_s), FleetSync.SCRIPTS), endpoints, interval_s,
                     on_sync=on_sync, scrapes=scrapes)


def build_queue_sync(policy: Policy, queued: Callable[[], dict[str, int]]) -> QueueSync | None:
    """The replicas' admission-queue lengths for the autoscaler, when it is on and Redis is the limits store."""
    redis_at = redis_settings(policy)
    if redis_at is None or not policy.autoscaling.enabled:
        return None
    interval_s = policy.autoscaling.sample_interval_s
    return QueueSync(redis_at.client(max(0.05, interval_s), QueueSync.SCRIPTS), queued, interval_s)


def build_calibration_sync(policy: Policy, calibration: PromptCalibration) -> CalibrationSync | None:
    """Prompt calibration shared by the service replicas, when Redis is the limits store."""
    redis_at = redis_settings(policy)
    if redis_at is None or not policy.limits.calibrate_prompt_tokens:
        return None
    return CalibrationSync(redis_at.client(1.0, CalibrationSync.SCRIPTS), calibration)


def build_placement_sync(policy: Policy, scheduler: Callable[[], Scheduler],
                         slot: Callable[[], tuple[int, int]] | None = None) -> PlacementSync | None:
    """Prefix placements shared by the service replicas, when Redis is the limits store (`slot`: this
    replica's index among the live replicas, from the in-flight exchange when it runs)."""
    redis_at = redis_settings(policy)
    if redis_at is None or not policy.shares_placements():
        return None
    interval_s = policy.scheduling.placement_sync_ms / 1000.0
    client = redis_at.client(max(0.1, interval_s), PlacementSync.SCRIPTS)
    replica = replica_name()
    push = None
    if policy.scheduling.push_requests:  # (its reader blocks for up to a second: a connection of its own)
        push = RequestPush(client, redis_at.client(_PUSH_BLOCK_S + 1.0), replica, block_s=_PUSH_BLOCK_S)
    return PlacementSync(client, scheduler, interval_s, slot=slot, replica_id=replica, push=push)


def build_rollout_store(policy: Policy) -> RolloutStore:
    """Rollout state goes where the limits go: Redis makes every replica apply the same weights."""
    redis_at = redis_settings(policy)
    if redis_at is None:
        return MemoryRolloutStore()
    return RedisRolloutStore(redis_at.url, cluster=redis_at.cluster, tls=redis_at.tls)
