"""The `Store` port of the limits package: what admission asks, what it gets back.

Every check for one request travels together so a shared store (Redis) answers it in one atomic
round trip. Times are seconds since the Unix epoch (wall clock: shared by every replica).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class RateLimit:
    """Token bucket: `rate` requests per second, bursts up to `burst` requests."""

    key: str
    rate: float
    burst: float


@dataclass(frozen=True, slots=True)
class ConcurrencyLimit:
    """At most `limit` leases alive under `key`; a lease expires after `lease_ttl_s` unless renewed."""

    key: str
    limit: int
    lease_ttl_s: float = 600.0


@dataclass(frozen=True, slots=True)
class TokenBudget:
    """At most `limit` tokens per `window_s` (60 = per minute, 86400 = per day) under `key`.

    Admission reserves `tokens` (an estimate) if the window's usage plus the reservation fits; the
    reservation is later corrected to the real usage with `Store.settle`.
    """

    key: str
    limit: int
    window_s: int


@dataclass(frozen=True, slots=True)
class AdmitRequest:
    request_id: str  # unique per request; names the concurrency leases and the reservation
    now: float
    tokens: int  # estimated prompt + completion tokens to reserve in every budget
    rates: tuple[RateLimit, ...] = ()
    concurrency: tuple[ConcurrencyLimit, ...] = ()
    budgets: tuple[TokenBudget, ...] = ()


@dataclass(frozen=True, slots=True)
class LimitState:
    """One dimension after the decision, for x-ratelimit-* headers (remaining never below 0)."""

    name: str  # "requests", "concurrency", "tokens" or "tokens-day" ...
    key: str
    limit: float
    remaining: float
    reset_s: float  # seconds until fully (buckets) or partly (windows) replenished


@dataclass(frozen=True, slots=True)
class AdmitResult:
    admitted: bool
    # When refused: which limit refused and how long until retrying can succeed.
    refused_by: str | None = None
    retry_after_s: float = 0.0
    states: tuple[LimitState, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class Reservation:
    """What an admitted request holds: leases to release and reserved tokens to settle."""

    request_id: str
    tokens: int
    concurrency: tuple[ConcurrencyLimit, ...]
    budgets: tuple[TokenBudget, ...]
    admitted_at: float

    @classmethod
    def of(cls, request: AdmitRequest) -> Reservation:
        """What an admitted `request` holds."""
        return cls(request.request_id, request.tokens, request.concurrency, request.budgets, request.now)


class StoreUnavailable(Exception):
    """The store could not answer within its deadline (Redis down or slow)."""


class StoreTimeout(StoreUnavailable):
    """The store is connected but its reply did not come within the deadline (slow, maybe only once)."""


class Store(Protocol):
    async def admit(self, request: AdmitRequest) -> AdmitResult:
        """All-or-nothing: either every dimension admits (and leases + reservations are taken), or none
        changes state. Rate buckets are consumed only on admission."""
        ...

    async def release(self, reservation: Reservation, now: float) -> None:
        """Release the concurrency leases (idempotent)."""
        ...

    async def settle(self, reservation: Reservation, actual_tokens: int, now: float) -> None:
        """Correct every budget by (actual - reserved) in the window the reservation was charged to
        (idempotent per request_id: a second settle changes nothing)."""
        ...

    async def close(self) -> None: ...
