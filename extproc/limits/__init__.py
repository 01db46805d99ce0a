"""Per-tenant limits shared across replicas: token buckets, concurrency leases and sliding-window token
budgets behind the `Store` port, with an in-memory store, a Redis store and a failover policy."""

from extproc.limits.cluster import hash_tag
from extproc.limits.failover import FailoverStore
from extproc.limits.memory import MemoryStore
from extproc.limits.redis_store import RedisStore
from extproc.limits.types import (
    AdmitRequest,
    AdmitResult,
    ConcurrencyLimit,
    LimitState,
    RateLimit,
    Reservation,
    Store,
    StoreTimeout,
    StoreUnavailable,
    TokenBudget,
)

__all__ = ["AdmitRequest", "AdmitResult", "ConcurrencyLimit", "FailoverStore", "LimitState", "MemoryStore",
           "RateLimit", "RedisStore", "Reservation", "Store", "StoreTimeout", "StoreUnavailable", "TokenBudget",
           "hash_tag"]
