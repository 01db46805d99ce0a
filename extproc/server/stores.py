"""Build the limit store a policy asks for: memory, or Redis with a failure policy."""

from __future__ import annotations

import dataclasses
import math
import os

from extproc.config import Policy
from extproc.limits.failover import FailoverStore
from extproc.limits.memory import MemoryStore
from extproc.limits.redis_store import RedisStore
from extproc.limits.types import AdmitRequest, AdmitResult, Reservation, Store

REDIS_URL_ENV = "EXTPROC_REDIS_URL"


class ScaledStore:
    """A per-replica share of every limit: what fail-open falls back to while the shared store is down.

    With N replicas each admitting up to limit/N locally, the fleet stays near the real limit.
    """

    def __init__(self, inner: Store, replicas: int) -> None:
        self._inner = inner
        self._replicas = max(1, replicas)

    def _scale(self, request: AdmitRequest) -> AdmitRequest:
        n = self._replicas
        if n == 1:
            return request
        return dataclasses.replace(
            request,
            rates=tuple(dataclasses.replace(r, rate=r.rate / n, burst=max(1.0, r.burst / n)) for r in request.rates),
            concurrency=tuple(dataclasses.replace(c, limit=max(1, math.ceil(c.limit / n)))
                              for c in request.concurrency),
            budgets=tuple(dataclasses.replace(b, limit=max(1, b.limit // n)) for b in request.budgets),
        )

    async def admit(self, request: AdmitRequest) -> AdmitResult:
        return await self._inner.admit(self._scale(request))

    async def release(self, reservation: Reservation, now: float) -> None:
        await self._inner.release(reservation, now)

    async def settle(self, reservation: Reservation, actual_tokens: int, now: float) -> None:
        await self._inner.settle(reservation, actual_tokens, now)

    async def close(self) -> None:
        await self._inner.close()


def build_store(policy: Policy) -> tuple[Store, RedisStore | None]:
    """The store admission uses, and the Redis client behind it (to warm up at start), if any."""
    limits = policy.limits
    if limits.store == "memory":
        return MemoryStore(), None
    url = os.environ.get(REDIS_URL_ENV) or limits.redis_url
    if not url:
        raise ValueError(f"limits.store is redis but neither limits.redis_url nor ${REDIS_URL_ENV} is set")
    replicas = max(1, len(policy.envoy.extproc_endpoints))
    redis = RedisStore(url)
    store = FailoverStore(redis, ScaledStore(MemoryStore(), replicas), limits.on_store_failure,
                          deadline_ms=limits.decision_deadline_ms)
    return store, redis
