"""`FailoverStore`: a shared primary store (Redis) with a policy for when it is down or slow (README,
"The limits model": what it admits while Redis is away).

The primary bounds its own calls (`RedisStore`: the decision deadline for admissions, its client
timeout otherwise). A `SlicedStore` primary is asked for an admission from its slices first, even while
marked down. On `StoreUnavailable` (`StoreTimeout`: a late reply): "fail-open" decides with the fallback
(a per-replica `MemoryStore`) at `fallback_share` (1 / replicas) of every limit, each token budget also
capped by the primary's view of what was left (`Slices.caps`); a late admission it admits is kept by
the primary (`keep`), one it refuses is undone. "fail-closed" refuses ("store_unavailable",
`retry_after_s`). A failure marks the primary down (not asked again until `probe_backoff_s`, then one
admission probes it); late replies do so only after `down_after_timeouts` in a row over at least
`down_after_s` (a scheduling hiccup makes several late at once). Release/settle go where the reservation
was admitted (a kept one: both), tried on the primary even while it is down; failures are counted and
logged, never raised. `record_failure`: a failure the primary learns of later (a posted call).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from typing import Literal, Protocol, runtime_checkable

from extproc.limits.memory import MemoryStore
from extproc.limits.slices import Slices
from extproc.limits.types import AdmitRequest, AdmitResult, Reservation, Store, StoreTimeout, StoreUnavailable

__all__ = ["STORE_UNAVAILABLE", "FailoverStore", "Policy", "SlicedStore", "share_of"]

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


@runtime_checkable
class SlicedStore(Protocol):
    """A primary that holds slices of the limits (admits from them without waiting for itself), and
    remembers what it last said was left (`Slices.caps`)."""

    slices: Slices | None

    async def admit_local(self, request: AdmitRequest) -> AdmitResult | None: ...

    def keep(self, request: AdmitRequest) -> None: ...


class FailoverStore:
    def __init__(self, primary: Store, fallback: MemoryStore, policy: Policy, retry_after_s: float = 1.0, *,
                 fallback_share: float = 1.0, probe_backoff_s: float = 1.0, down_after_timeouts: int = 3,
                 down_after_s: float = 0.1, clock: Callable[[], float] = time.monotonic,
                 logger: logging.Logger | None = None) -> None:
        if policy not in ("fail-open", "fail-closed"):
            raise ValueError(f"unknown store failure policy {policy!r}")
        if not 0.0 < fallback_share <= 1.0:
            raise ValueError(f"fallback_share must be in (0, 1], got {fallback_share}")
        if down_after_timeouts < 1:
            raise ValueError(f"down_after_timeouts must be >= 1, got {down_after_timeouts}")
        self._share = fallback_share
        self._down_after_timeouts = down_after_timeouts
        self._down_after_s = down_after_s
        self._timeouts_in_a_row = 0
        self._late_since = 0.0  # clock of the first late reply in a row
        self.policy: Policy = policy
        self.failures_total = 0  # failed primary calls (admit, release, settle)
        self.degraded_admits_total = 0  # admissions decided by the policy instead of the primary
        self._primary = primary
        self._fallback = fallback
        self._retry_after_s = retry_after_s
        self._backoff_s = probe_backoff_s
        self._clock = clock
        self._log = logger or logging.getLogger(__name__)
        self._down_since: float | None = None
        self._next_probe = 0.0
        # request_id -> (when we may forget it (clock), also admitted by the primary)
        self._on_fallback: dict[str, tuple[float, bool]] = {}
        self._next_sweep = 0.0
        self._sliced = primary if isinstance(primary, SlicedStore) else None

    @property
    def primary_up(self) -> bool:
        return self._down_since is None

    async def admit(self, request: AdmitRequest) -> AdmitResult:
        self._sweep()
        if self._down_since is not None and self._sliced is not None:
            local = await self._sliced.admit_local(request)
            if local is not None:
                return local
        if self._may_ask_primary():
            try:
                result = await self._primary.admit(request)
            except StoreTimeout as exc:
                self._late(exc)
                return self._degraded(request, late=True)
            except StoreUnavailable as exc:
                self._failed("admit", exc)
            else:
                self._succeeded()
                return result
        return self._degraded(request)

    async def release(self, reservation: Reservation, now: float) -> None:
        local = self._on_fallback.get(reservation.request_id)
        if local is not None:
            if not reservation.budgets:  # nothing left to settle
                self._on_fallback.pop(reservation.request_id, None)
            await self._fallback.release(reservation, now)
            if not local[1]:
                return
        try:
            await self._primary.release(reservation, now)
        except StoreUnavailable as exc:
            self._failed("release", exc)

    async def settle(self, reservation: Reservation, actual_tokens: int, now: float) -> None:
        local = self._on_fallback.pop(reservation.request_id, None)
        if local is not None:
            self._fallback.settle_now(reservation, actual_tokens, now)
            if not local[1]:
                return
        try:
            await self._primary.settle(reservation, actual_tokens, now)
        except StoreUnavailable as exc:
            self._failed("settle", exc)

    async def close(self) -> None:
        try:
            await self._primary.close()
        finally:
            await self._fallback.close()

    def record_failure(self, call: str, reason: str) -> None:
        """A primary call that failed after it returned (e.g. a posted release whose reply was an error)."""
        self._failed(call, StoreUnavailable(reason))

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

    def _late(self, exc: BaseException) -> None:
        """An admission's reply missed its deadline: the primary is marked down only once replies have
        been late `down_after_timeouts` times in a row over at least `down_after_s` (or it was down)."""
        self._timeouts_in_a_row += 1
        now = self._clock()
        if self._timeouts_in_a_row == 1:
            self._late_since = now
        if self.primary_up and (self._timeouts_in_a_row < self._down_after_timeouts
                                or now - self._late_since < self._down_after_s):
            self.failures_total += 1
            self._log.debug("limits store late (%s in a row): %s", self._timeouts_in_a_row, exc)
        else:
            self._failed("admit", exc)

    def _succeeded(self) -> None:
        self._timeouts_in_a_row = 0
        if self._down_since is not None:
            self._log.warning("limits store up again after %.1fs", self._clock() - self._down_since)
            self._down_since = None

    def _degraded(self, request: AdmitRequest, late: bool = False) -> AdmitResult:
        """The policy's decision. `late`: the primary's admission timed out but may still run; kept there
        if the fallback admits the request (the primary counts it too), undone otherwise."""
        self.degraded_admits_total += 1
        if self.policy == "fail-closed":
            return AdmitResult(admitted=False, refused_by=STORE_UNAVAILABLE, retry_after_s=self._retry_after_s)
        sliced = self._sliced
        slices = sliced.slices if sliced is not None else None
        result = self._fallback.admit_now(share_of(request, self._share),
                                          slices.caps(request, self._share) if slices is not None else ())
        kept = late and result.admitted and sliced is not None
        if slices is not None and result.admitted:
            slices.admitted_alone(request)
        if kept and sliced is not None:
            sliced.keep(request)
        if result.admitted and (request.concurrency or request.budgets):
            horizon = max([c.lease_ttl_s for c in request.concurrency] + [2.0 * b.window_s for b in request.budgets])
            self._on_fallback[request.request_id] = (self._clock() + horizon, kept)
        return result

    def _sweep(self) -> None:
        now = self._clock()
        if now < self._next_sweep:
            return
        self._next_sweep = now + _SWEEP_INTERVAL_S
        self._on_fallback = {rid: held for rid, held in self._on_fallback.items() if held[0] > now}
