"""Cheap refusals before a body is parsed, from what this process already knows about a tenant.

Parsing a body is the expensive part of a decision, and it used to run before any limit of the tenant was
looked at. Three facts let the headers phase (and the body phase, before parsing) refuse at once:
- this process alone already holds as many of the tenant's tenant-wide concurrency leases as its limit
  allows (a sound refusal: those leases are real, whatever the other replicas hold);
- the store refused the tenant's request rate with a retry time that has not passed yet (nothing refills
  a token bucket faster than its rate);
- the tenant spent its parse budget: time its decisions held this process's event loop per second (a token
  bucket of seconds), so one tenant's bodies cannot starve the others' decisions. The anonymous tenant (auth
  mode none: every caller) has no parse budget.

The budget counts loop time (wall clock, never less than the decision's CPU time), not CPU time: while a
decision runs nothing else in the process does, whatever share of a core the process gets. Counted in CPU time,
a 500 ms/s budget is the whole of a service that gets half a core or less, and a flood of large bodies within it
left other tenants' messages queued past Envoy's message_timeout (500s; issue 14 item 4, reports/suite-s13).
A body is also charged before it arrives: at the headers, its declared length times the loop time a body byte
has cost lately (`reserve`), given back when its decision starts (`refund`; the decision's real cost is then
charged) or when the exchange ends without one. Without it a tenant's concurrent requests all pass the headers
check while its bucket is still full, and their bodies then hold the loop together (8 x 3.5 MB: about a second
on a third of a core).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from extproc.config.schema import BoundsConfig, TierLimits
from extproc.gateway.admission import rate_limited, tenant_wide
from extproc.limits.types import ConcurrencyLimit
from extproc.openai.errors import ApiError
from extproc.tenants import ANONYMOUS, Tenant

__all__ = ["TenantGate", "parse_budget_exceeded"]

_MAX_TRACKED = 4096  # tenants with state before idle ones are dropped
# Loop seconds per body byte before any large body was measured: a 3.5 MB body of tiny messages at ~105 ms, its
# cost on about a third of a core (~35 ms on a whole one: decode and resolve, measured 16-34 ms), so that the first
# flood after a start is not let in at a whole core's estimate; learned from bodies of LEARN_BYTES and more.
DEFAULT_SECONDS_PER_BYTE = 30e-9
LEARN_BYTES = 64 * 1024
_LEARN_WEIGHT = 0.2  # of the latest large body in the moving average


def parse_budget_exceeded(retry_after_s: float) -> ApiError:
    seconds = max(1, math.ceil(retry_after_s))
    return ApiError(429, f"Too much request processing for this key; retry after {seconds}s",
                    "rate_limit_exceeded", "processing_budget_exceeded", headers=(("retry-after", str(seconds)),))


class TenantGate:
    """Per-tenant state of this process; one owner (the Gateway), no I/O."""

    def __init__(self) -> None:
        self._holding: dict[str, int] = {}  # tenant -> exchanges here holding a tenant-wide concurrency lease
        self._rate_until: dict[str, float] = {}  # tenant -> clock time until which its request rate refuses
        self._budget: dict[str, tuple[float, float]] = {}  # tenant -> (parse seconds left, clock time)
        self.seconds_per_byte = DEFAULT_SECONDS_PER_BYTE  # what a large body's decision held the loop, lately

    def refusal(self, tenant: Tenant, limits: TierLimits, bounds: BoundsConfig,
                now: float) -> tuple[str, ApiError] | None:
        """(dimension, error) when `tenant` is refused before its body is parsed, else None."""
        name = tenant.name
        if limits.concurrency is not None and self._holding.get(name, 0) >= limits.concurrency:
            return "concurrency", rate_limited("concurrency", 1.0, ())
        until = self._rate_until.get(name)
        if until is not None:
            if now < until:
                return "requests", rate_limited("requests", until - now, ())
            del self._rate_until[name]
        left = self._left(name, bounds, now)
        if left < 0:
            return "processing", parse_budget_exceeded(-left / (bounds.tenant_parse_ms_per_s / 1000.0))
        return None

    def _left(self, name: str, bounds: BoundsConfig, now: float) -> float:
        state = self._budget.get(name)
        if state is None or bounds.tenant_parse_ms_per_s <= 0:
            return 0.0
        left, at = state
        return min(bounds.tenant_parse_burst_ms / 1000.0, left + (now - at) * bounds.tenant_parse_ms_per_s / 1000.0)

    def reserve(self, tenant: Tenant, declared: str, bounds: BoundsConfig, now: float) -> float:
        """A request of `tenant` passed the headers with content-length `declared`: charge what its body is
        likely to cost now, before it arrives; returns the seconds charged (0: no budget, no declared length)."""
        if tenant is ANONYMOUS or bounds.tenant_parse_ms_per_s <= 0 or not declared.isdigit():
            return 0.0
        seconds = int(declared) * self.seconds_per_byte
        self._spend(tenant.name, seconds, bounds, now)
        return seconds

    def refund(self, tenant: Tenant, reserved_s: float, bounds: BoundsConfig, now: float) -> None:
        """The exchange ended without a decision on its body: give back what `reserve` charged."""
        if reserved_s and tenant is not ANONYMOUS and bounds.tenant_parse_ms_per_s > 0:
            self._spend(tenant.name, -reserved_s, bounds, now)

    def charge(self, tenant: Tenant, spent_s: float, bounds: BoundsConfig, now: float, body_bytes: int = 0) -> None:
        """A decision for `tenant` held the loop `spent_s` seconds on a body of `body_bytes`."""
        if body_bytes >= LEARN_BYTES:
            rate = spent_s / body_bytes
            self.seconds_per_byte += _LEARN_WEIGHT * (rate - self.seconds_per_byte)
        if tenant is ANONYMOUS or bounds.tenant_parse_ms_per_s <= 0:
            return
        self._spend(tenant.name, spent_s, bounds, now)

    def _spend(self, name: str, seconds: float, bounds: BoundsConfig, now: float) -> None:
        start = self._left(name, bounds, now) if name in self._budget else bounds.tenant_parse_burst_ms / 1000.0
        if len(self._budget) >= _MAX_TRACKED and name not in self._budget:
            self._forget_idle(bounds, now)
        self._budget[name] = (start - seconds, now)

    def _forget_idle(self, bounds: BoundsConfig, now: float) -> None:
        full = bounds.tenant_parse_burst_ms / 1000.0
        for name in [n for n in self._budget if self._left(n, bounds, now) >= full]:
            del self._budget[name]
        for name in [n for n, until in self._rate_until.items() if until <= now]:
            del self._rate_until[name]

    def store_refused(self, tenant: Tenant, refused_by: str | None, retry_after_s: float, now: float) -> None:
        """The store refused an admission of `tenant`: remember a refusal of its tenant-wide request rate
        (refused_by "requests:<key>") until `retry_after_s` from `now`."""
        dimension, _, key = (refused_by or "").partition(":")
        if dimension == "requests" and tenant_wide(key) and math.isfinite(retry_after_s) and retry_after_s > 0:
            if len(self._rate_until) >= _MAX_TRACKED:
                self._rate_until = {n: t for n, t in self._rate_until.items() if t > now}
            self._rate_until[tenant.name] = now + retry_after_s

    def admitted(self, tenant: Tenant, concurrency: Sequence[ConcurrencyLimit]) -> bool:
        """An admission of `tenant` took `concurrency` leases; True if one is tenant-wide (then counted here
        until `drop`)."""
        if not any(tenant_wide(limit.key) for limit in concurrency):
            return False
        self._holding[tenant.name] = self._holding.get(tenant.name, 0) + 1
        return True

    def drop(self, tenant: Tenant) -> None:
        left = self._holding.get(tenant.name, 0) - 1
        if left > 0:
            self._holding[tenant.name] = left
        else:
            self._holding.pop(tenant.name, None)
