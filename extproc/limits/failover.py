"""`FailoverStore`: a shared primary store (Redis) with a policy for when it is down or slow.

Each admission waits at most `deadline_ms` for the primary. On `StoreUnavailable` or that deadline:
  - "fail-open": the fallback store (a per-replica `MemoryStore`) decides. Limits travel in each
    request, so the fallback sees them scaled by `fallback_share` (the caller passes 1 / replicas):
    rates and burst, concurrency and budgets are multiplied (rounded up, at least 1), so the fleet
    stays near its limits while Redis is away;
  - "fail-closed": refused with refused_by="store_unavailable" and `retry_after_s`.
After a failure the primary is marked down and not asked again until `probe_backoff_s` has passed;
then one admission probes it (others keep using the policy meanwhile) and success marks it up.
One log line per change of state (down / up); `failures_total` counts every failed primary call.

Reservations remember where they were admitted: release/settle of a fallback admission go to the
fallback, all others to the primary (bounded by `cleanup_deadline_ms`, tried even while it is marked
down so leases are not left to expire). A failing release/settle is logged and counted, never raised:
its leases expire by TTL and its reservation stays at the estimate.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Callable
from typing import Literal

from extproc.limits.types import AdmitRequest, AdmitResult, Reservation, Store, StoreUnavailable

__all__ = ["STORE_UNAVAILABLE", "FailoverStore", "Policy", "share_of"]

Policy = Literal["fail-open", "fail-closed"]
STORE_UNAVAILABLE = "store_unavailable"
_SWEEP_INTERVAL_S = 10.0


def share_of(request: AdmitRequest, share: float) -> AdmitRequest:
    """The request with every limit scaled to `share` (0 < share <= 1) of the fleet's, rounded up."""
    if share >= 1.0:
        return request
    return dataclasses.replace(
        request,
        rates=tuple(dataclasses.replace(r, rate=r.rate * share, burst=max(1.0, float(math.ceil(r.burst * share))))
                    for r in request.rates),
        concurrency=tuple(dataclasses.replace(c, limit=max(1, math.ceil(c.limit * share)))
                          for c in request.concurrency),
        budgets=tuple(dataclasses.replace(b, limit=max(1, math.ceil(b.limit * share))) for b in request.budgets),
    )


class FailoverStore:
    def __init__(self, primary: Store, fallback: Store, policy: Policy, deadline_ms: float = 5.0,
                 retry_after_s: float = 1.0, *, fallback_share: float = 1.0, probe_backoff_s: float = 1.0,
                 cleanup_deadline_ms: float = 50.0, clock: Callable[[], float] = time.monotonic,
                 logger: logging.Logger | None = None) -> None:
        if policy not in ("fail-open", "fail-closed"):
            raise ValueError(f"unknown store failure policy {policy!r}")
        if not 0.0 < fallback_share <= 1.0:
            raise ValueError(f"fallback_share must be in (0, 1], got {fallback_share}")
        self._share = fallback_share
        self.policy: Policy = policy
        self.failures_total = 0  # failed primary calls (admit, release, settle)
        self.degraded_admits_total = 0  # admissions decided by the policy instead of the primary
        self._primary = primary
        self._fallback = fallback
        self._deadline_s = deadline_ms / 1000.0
        self._cleanup_deadline_s = cleanup_deadline_ms / 1000.0
        self._retry_after_s = retry_after_s
        self._backoff_s = probe_backoff_s
        self._clock = clock
        self._log = logger or logging.getLogger(__name__)
        self._down_since: float | None = None
        self._next_probe = 0.0
        self._on_fallback: dict[str, float] = {}  # request_id -> when we may forget it (clock)
        self._next_sweep = 0.0

    @property
    def primary_up(self) -> bool:
        return self._down_since is None

    async def admit(self, request: AdmitRequest) -> AdmitResult:
        if self._may_ask_primary():
            try:
                async with asyncio.timeout(self._deadline_s):
                    result = await self._primary.admit(request)
            except (StoreUnavailable, TimeoutError) as exc:
                self._failed("admit", exc)
            else:
                self._succeeded()
                return result
        return await self._degraded(request)

    async def release(self, reservation: Reservation, now: float) -> None:
        if reservation.request_id in self._on_fallback:
            if not reservation.budgets:  # nothing left to settle
                self._on_fallback.pop(reservation.request_id, None)
            await self._fallback.release(reservation, now)
            return
        try:
            async with asyncio.timeout(self._cleanup_deadline_s):
                await self._primary.release(reservation, now)
        except (StoreUnavailable, TimeoutError) as exc:
            self._failed("release", exc)

    async def settle(self, reservation: Reservation, actual_tokens: int, now: float) -> None:
        if self._on_fallback.pop(reservation.request_id, None) is not None:
            await self._fallback.settle(reservation, actual_tokens, now)
            return
        try:
            async with asyncio.timeout(self._cleanup_deadline_s):
                await self._primary.settle(reservation, actual_tokens, now)
        except (StoreUnavailable, TimeoutError) as exc:
            self._failed("settle", exc)

    async def close(self) -> None:
        try:
            await self._primary.close()
        finally:
            await self._fallback.close()

    # --- state ----------------------------------------------------------------------------------

    def _may_ask_primary(self) -> bool:
        if self._down_since is None:
            return True
        now = self._clock()
        if now < self._next_probe:
            return False
        self._next_probe = now + self._backoff_s  # this caller probes; the others keep the policy
        return True

    def _failed(self, call: str, exc: BaseException) -> None:
        self.failures_total += 1
        now = self._clock()
        if self._down_since is None:
            self._down_since = now
            self._next_probe = now + self._backoff_s
            reason = str(exc) or type(exc).__name__
            self._log.warning("limits store down (%s failed: %s); policy %s, next probe in %.1fs", call, reason,
                              self.policy, self._backoff_s)
        else:
            self._log.debug("limits store still down (%s failed: %s)", call, exc)

    def _succeeded(self) -> None:
        if self._down_since is not None:
            self._log.warning("limits store up again after %.1fs", self._clock() - self._down_since)
            self._down_since = None

    async def _degraded(self, request: AdmitRequest) -> AdmitResult:
        self.degraded_admits_total += 1
        if self.policy == "fail-closed":
            return AdmitResult(admitted=False, refused_by=STORE_UNAVAILABLE, retry_after_s=self._retry_after_s)
        result = await self._fallback.admit(share_of(request, self._share))
        if result.admitted and (request.concurrency or request.budgets):
            now = self._clock()
            self._sweep(now)
            horizon = max([c.lease_ttl_s for c in request.concurrency] + [2.0 * b.window_s for b in request.budgets])
            self._on_fallback[request.request_id] = now + horizon
        return result

    def _sweep(self, now: float) -> None:
        if now < self._next_sweep:
            return
        self._next_sweep = now + _SWEEP_INTERVAL_S
        self._on_fallback = {rid: until for rid, until in self._on_fallback.items() if until > now}
