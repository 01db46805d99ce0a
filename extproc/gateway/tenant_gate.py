"""Cheap refusals before a body is parsed, from what this process already knows about a tenant.

Parsing a body is the expensive part of a decision, and it used to run before any limit of the tenant was
looked at. Three facts let the headers phase (and the body phase, before parsing) refuse at once:
- this process alone already holds as many of the tenant's tenant-wide concurrency leases as its limit
  allows (a sound refusal: those leases are real, whatever the other replicas hold);
- the store refused the tenant's request rate with a retry time that has not passed yet (nothing refills
  a token bucket faster than its rate);
- the tenant spent its parse budget: decision CPU time per second (a token bucket of seconds, charged with
  the measured CPU time of each decision), so one tenant's bodies cannot starve the others' decisions.
  The anonymous tenant (auth mode none: every caller) has no parse budget.
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

    def charge(self, tenant: Tenant, cpu_s: float, bounds: BoundsConfig, now: float) -> None:
        """A decision for `tenant` took `cpu_s` seconds of CPU."""
        if tenant is ANONYMOUS or bounds.tenant_parse_ms_per_s <= 0:
            return
        name = tenant.name
        start = self._left(name, bounds, now) if name in self._budget else bounds.tenant_parse_burst_ms / 1000.0
        if len(self._budget) >= _MAX_TRACKED and name not in self._budget:
            self._forget_idle(bounds, now)
        self._budget[name] = (start - cpu_s, now)

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
