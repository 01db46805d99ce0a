"""Build the limit store a policy asks for: memory, or Redis with a failure policy."""

from __future__ import annotations

import os

from extproc.config import Policy
from extproc.limits.failover import FailoverStore
from extproc.limits.headroom import Headroom
from extproc.limits.memory import MemoryStore
from extproc.limits.redis_store import RedisStore
from extproc.limits.types import Store

REDIS_URL_ENV = "EXTPROC_REDIS_URL"


def build_store(policy: Policy) -> tuple[Store, RedisStore | None]:
    """The store admission uses, and the Redis client behind it (to warm up at start), if any.

    With Redis, fail-open decides locally with this replica's share (1 / replicas) of every limit, and
    optimistic admission (unless turned off) runs ahead of Redis by at most that share of what it reported left.
    """
    limits = policy.limits
    if limits.store == "memory":
        return MemoryStore(), None
    url = os.environ.get(REDIS_URL_ENV) or limits.redis_url
    if not url:
        raise ValueError(f"limits.store is redis but neither limits.redis_url nor ${REDIS_URL_ENV} is set")
    replicas = limits.replicas or max(1, len(policy.envoy.extproc_endpoints))
    headroom = Headroom(share=1.0 / replicas, max_age_s=limits.optimistic_max_age_ms / 1000.0) \
        if limits.optimistic_admission else None
    # The Redis client enforces the decision deadline itself, on the admission's reply (see FailoverStore).
    redis = RedisStore(url, admit_timeout_ms=limits.decision_deadline_ms, headroom=headroom)
    # Redis bounds every call itself (the admission deadline on the reply, the rest by its client
    # timeout; release and settle do not wait for replies), so the failover adds no timers of its own.
    store = FailoverStore(redis, MemoryStore(), limits.on_store_failure, deadline_ms=None,
                          cleanup_deadline_ms=None, fallback_share=1.0 / replicas)
    redis.on_posted_failure = store.record_failure
    return store, redis
