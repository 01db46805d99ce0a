"""Admission: which limits apply to a request, the stage that asks the store, and how the limits' state becomes
response headers.

Every key carries the tenant in a `{...}` hash tag so one Lua call touches one Redis Cluster slot.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from extproc.config.schema import LimitsConfig, TierConfig, TierLimits
from extproc.gateway.records import Admitted, Caller, Resolved
from extproc.limits.types import (
    AdmitRequest,
    AdmitResult,
    ConcurrencyLimit,
    LimitState,
    RateLimit,
    Reservation,
    TokenBudget,
)
from extproc.openai.apis import SHAPES
from extproc.openai.errors import ApiError
from extproc.telemetry import GatewayMetrics
from extproc.tenants import Tenant

if TYPE_CHECKING:  # the tenant gate builds on this module's helpers
    from extproc.gateway.tenant_gate import TenantGate

_MINUTE, _DAY = 60, 86_400


def _scope(prefix: str, limits: TierLimits, lease_ttl_s: float) -> tuple[
        list[RateLimit], list[ConcurrencyLimit], list[TokenBudget]]:
    rates, concurrency, budgets = [], [], []
    if limits.requests_per_s is not None:
        burst = limits.burst if limits.burst is not None else max(1.0, 2.0 * limits.requests_per_s)
        rates.append(RateLimit(f"{prefix}:rps", limits.requests_per_s, burst))
    if limits.concurrency is not None:
        concurrency.append(ConcurrencyLimit(f"{prefix}:cc", limits.concurrency, lease_ttl_s))
    if limits.tokens_per_min is not None:
        budgets.append(TokenBudget(f"{prefix}:tpm", limits.tokens_per_min, _MINUTE))
    if limits.tokens_per_day is not None:
        budgets.append(TokenBudget(f"{prefix}:tpd", limits.tokens_per_day, _DAY))
    return rates, concurrency, budgets


def tenant_wide(key: str) -> bool:
    """A key of the tenant's total limits (not of one model): "{tenant}:all:..." (the tag's "}" is its first)."""
    return key.partition("}")[2].startswith(":all:")


def has_budgets(limits: TierLimits) -> bool:
    return limits.tokens_per_min is not None or limits.tokens_per_day is not None


def admit_request(tenant: Tenant, tier: TierConfig, model: str, request_id: str, now: float, tokens: int,
                  config: LimitsConfig) -> AdmitRequest | None:
    """The checks for `tenant` on `model` (served name); None when no limit applies."""
    tag = "{" + tenant.name.replace("}", "_") + "}"
    rates: list[RateLimit] = []
    concurrency: list[ConcurrencyLimit] = []
    budgets: list[TokenBudget] = []
    for prefix, limits in ((f"{tag}:all", tenant.limits or tier.limits),
                           (f"{tag}:m:{model}", tenant.model_limits or tier.model_limits)):
        r, c, b = _scope(prefix, limits, config.lease_ttl_s)
        rates += r
        concurrency += c
        budgets += b
    if not (rates or concurrency or budgets):
        return None
    return AdmitRequest(request_id, now, tokens, tuple(rates), tuple(concurrency), tuple(budgets))


def _duration(seconds: float) -> str:
    """OpenAI's x-ratelimit-reset-* format: 1s, 6m0s, 1h2m3s, 120ms."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    total = math.ceil(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def _tightest(states: Iterable[LimitState]) -> dict[str, LimitState]:
    """The state of least remaining per kind (requests, tokens); concurrency is not a header's."""
    tightest: dict[str, LimitState] = {}
    for state in states:
        kind = "requests" if state.name in ("requests", "concurrency") else "tokens"
        if state.name == "concurrency":
            continue  # not an OpenAI header; requests/s is what clients pace themselves by
        current = tightest.get(kind)
        if current is None or state.remaining < current.remaining:
            tightest[kind] = state
    return tightest


def ratelimit_headers(states: Iterable[LimitState], anthropic_at: float | None = None) -> tuple[tuple[str, str], ...]:
    """x-ratelimit-{limit,remaining,reset}-{requests,tokens}: the tightest state of each kind; with
    `anthropic_at` (the decision's wall-clock time: the Messages API) Anthropic's names too,
    anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}, whose reset is an RFC 3339 instant. Our token
    limits count input and output together, so Anthropic's input-tokens / output-tokens families are not sent."""
    tightest = _tightest(states)
    headers: list[tuple[str, str]] = []
    for kind, state in sorted(tightest.items()):
        headers += [
            (f"x-ratelimit-limit-{kind}", str(int(state.limit))),
            (f"x-ratelimit-remaining-{kind}", str(max(0, int(state.remaining)))),
            (f"x-ratelimit-reset-{kind}", _duration(state.reset_s)),
        ]
    if anthropic_at is not None:
        for kind, state in sorted(tightest.items()):
            reset = datetime.fromtimestamp(anthropic_at + math.ceil(max(0.0, state.reset_s)), UTC)
            headers += [
                (f"anthropic-ratelimit-{kind}-limit", str(int(state.limit))),
                (f"anthropic-ratelimit-{kind}-remaining", str(max(0, int(state.remaining)))),
                (f"anthropic-ratelimit-{kind}-reset", reset.strftime("%Y-%m-%dT%H:%M:%SZ")),
            ]
    return tuple(headers)


def refused_dimension(refused_by: str | None) -> str:
    """The bounded part of a store's `refused_by` ("<dimension>:<key>[:too-large]")."""
    return (refused_by or "unknown").split(":", 1)[0]


def rate_limited(refused_by: str | None, retry_after_s: float, states: Iterable[LimitState],
                 anthropic_at: float | None = None) -> ApiError:
    seconds = max(1, math.ceil(retry_after_s)) if math.isfinite(retry_after_s) else 60
    dimension = refused_dimension(refused_by)
    what = {"requests": "requests per second", "concurrency": "concurrent requests",
            "tokens": "tokens per minute", "tokens-day": "tokens per day"}.get(dimension, dimension)
    if refused_by is not None and refused_by.endswith(":too-large"):
        return ApiError(429, f"Request too large for {what}: it needs more tokens than the whole limit; "
                             "lower max_tokens or the prompt", "rate_limit_exceeded", "request_too_large_for_limit")
    if dimension == "store_unavailable":
        return ApiError(503, "Rate limiting is temporarily unavailable; retry later", "server_error",
                        "limits_unavailable", headers=(("retry-after", str(seconds)),))
    return ApiError(
        429, f"Rate limit reached for {what}; retry after {seconds}s", "rate_limit_exceeded", "rate_limit_exceeded",
        headers=(("retry-after", str(seconds)), *ratelimit_headers(states, anthropic_at)),
    )


class Admit:
    """Stage 3, the limits: what to ask the store (`ask`), and what its answer means (`decide`). The server
    awaits the store in between: one round trip, bounded by its deadline."""

    def __init__(self, tenants: TenantGate, metrics: GatewayMetrics, wall_clock: Callable[[], float],
                 clock: Callable[[], float]) -> None:
        self._tenants = tenants
        self._metrics = metrics
        self._wall_clock = wall_clock
        self._clock = clock

    def ask(self, caller: Caller, resolved: Resolved) -> AdmitRequest | None:
        """The checks of the caller's limits for this request's model and cost; None when no limit applies."""
        return admit_request(caller.tenant, caller.tier, resolved.pool.model, caller.request_id, self._wall_clock(),
                             resolved.tokens, caller.runtime.policy.limits)

    def decide(self, caller: Caller, request: AdmitRequest, result: AdmitResult) -> Admitted:
        """Admitted, or raises the 429 (or 503 when the store is down and the policy fails closed)."""
        if not result.admitted:
            self._metrics.rate_limited.labels(refused_dimension(result.refused_by)).inc()
            self._tenants.store_refused(caller.tenant, result.refused_by, result.retry_after_s, self._clock())
            anthropic_at = request.now if SHAPES[caller.api].anthropic_errors else None
            raise rate_limited(result.refused_by, result.retry_after_s, result.states, anthropic_at)
        holds = self._tenants.admitted(caller.tenant, request.concurrency)
        anthropic_at = request.now if SHAPES[caller.api].anthropic_errors else None
        headers = ratelimit_headers(result.states, anthropic_at) if result.states else ()
        return Admitted(Reservation.of(request), result.states, holds, headers)
