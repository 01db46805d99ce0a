"""Rules every `Store` shares, written once so the memory store and the Redis Lua script agree.

The Lua script in `_lua.py` mirrors the arithmetic here operation for operation (IEEE doubles on
both sides, the same order of operations), and the contract tests run the same cases against both.
`verdict` turns per-dimension checks into an `AdmitResult` the same way for both stores. What other
replicas hold as slices (`Observed.claimed`, see `extproc.limits.slices`) counts as used.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from extproc.limits.types import AdmitRequest, AdmitResult, LimitState

# A refused concurrency check retries after this long at most: a lease may be released at any moment.
CONCURRENCY_RETRY_S = 1.0
# Comparisons allow this much rounding (in tokens): a request retried exactly after `retry_after_s`
# must fit although 60 * (1 - 10/60) is 50.00000000000001 in floating point.
EPSILON = 1e-9
# Computed waits are rounded up by this much so that `now + retry_after_s`, rounded to a double near
# 1.7e9 (steps of 2.4e-7 s), is never a hair too early.
RETRY_MARGIN_S = 1e-6
# Suffix of `refused_by` for a request that asks for more tokens than a budget's whole limit:
# retrying can never succeed (the gateway may answer 413 rather than 429).
TOO_LARGE = "too-large"


def budget_name(window_s: int) -> str:
    """The LimitState name of a token budget: "tokens" per minute, "tokens-day" per day, ..."""
    return {60: "tokens", 3600: "tokens-hour", 86400: "tokens-day"}.get(window_s, f"tokens-{window_s}s")


def refused_label(name: str, key: str, too_large: bool = False) -> str:
    """`refused_by` is "<dimension name>:<key>", plus ":too-large" when retrying cannot help."""
    return f"{name}:{key}:{TOO_LARGE}" if too_large else f"{name}:{key}"


# --- token bucket -------------------------------------------------------------------------------


def bucket_level(tokens: float | None, stamp: float, now: float, rate: float, burst: float) -> tuple[float, float]:
    """Refilled level and its new time stamp. A missing bucket is full; a clock that went backwards
    (another replica's `now` slightly behind) refills nothing rather than draining."""
    if tokens is None:
        return burst, now
    if now <= stamp:
        return tokens, stamp
    return min(burst, tokens + (now - stamp) * rate), now


def bucket_retry_s(level: float, rate: float) -> float:
    """Seconds until the bucket holds one whole token."""
    if bucket_admits(level):
        return 0.0
    if rate <= 0.0:
        return math.inf
    return (1.0 - level) / rate + RETRY_MARGIN_S


def bucket_reset_s(level: float, rate: float, burst: float) -> float:
    """Seconds until the bucket is full again."""
    if level >= burst:
        return 0.0
    if rate <= 0.0:
        return math.inf
    return (burst - level) / rate


def bucket_ttl_s(rate: float, burst: float) -> float:
    """How long an idle bucket must be kept: twice its time to refill from empty (at least 1 s).
    After a full refill a missing bucket and a stored one are the same."""
    if rate <= 0.0:
        return 86400.0
    return max(1.0, 2.0 * burst / rate)


# --- concurrency leases -------------------------------------------------------------------------


def concurrency_retry_s(earliest_expiry: float | None, now: float) -> float:
    """Retry after the earliest lease expiry or CONCURRENCY_RETRY_S, whichever comes first."""
    if earliest_expiry is None:
        return CONCURRENCY_RETRY_S
    return min(CONCURRENCY_RETRY_S, max(0.0, earliest_expiry - now) + RETRY_MARGIN_S)


# --- sliding-window token budgets ---------------------------------------------------------------


def window_index(now: float, window_s: int) -> int:
    return math.floor(now / window_s)


def window_estimate(previous: float, current: float, now: float, index: int, window_s: int) -> float:
    """Sliding-window estimate: the previous window weighted by the part of it still inside the
    sliding window, plus the whole current window."""
    elapsed = (now - index * window_s) / window_s
    return previous * (1.0 - elapsed) + current


def window_retry_s(previous: float, current: float, tokens: float, limit: float, now: float, index: int,
                   window_s: int) -> float:
    """Seconds until `tokens` fit, if nothing else is charged meanwhile; capped at `window_s`.

    Within this window the estimate falls as the previous window slides out. If even an empty
    previous window leaves no room, the current window becomes the previous one at the boundary
    and slides out in turn. Computed relative to the window start: absolute epoch seconds carry
    only ~2e-7 s of precision.
    """
    elapsed = now - index * window_s
    room = limit - current - tokens
    if room >= 0.0:
        if previous <= 0.0:
            return 0.0
        wait = window_s * (1.0 - room / previous) - elapsed
    else:
        room_next = limit - tokens
        if room_next < 0.0:
            return float(window_s)
        wait = window_s + window_s * max(0.0, 1.0 - room_next / current) - elapsed
    return min(float(window_s), max(0.0, wait) + RETRY_MARGIN_S)


def window_ttl_s(index: int, window_s: int, now: float) -> float:
    """A window matters until the end of the next one; keep it one second longer (<= 2 x window_s + 1)."""
    return (index + 2) * window_s - now + 1.0


# --- the decision -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Check:
    """One dimension of one admission: whether it allowed the request and its state afterwards."""

    name: str
    key: str
    limit: float
    ok: bool
    too_large: bool
    retry_s: float  # 0 when ok
    remaining: float
    reset_s: float


def verdict(checks: Sequence[Check]) -> AdmitResult:
    """Admitted iff every check is ok. When refused, `refused_by` names a too-large budget if any,
    else the first refusing check (rates, then concurrency, then budgets, in request order), and
    `retry_after_s` is the longest wait among the refusing checks (none can succeed sooner)."""
    states = tuple(LimitState(c.name, c.key, c.limit, max(0.0, c.remaining), max(0.0, c.reset_s)) for c in checks)
    refusing = [c for c in checks if not c.ok]
    if not refusing:
        return AdmitResult(admitted=True, states=states)
    blocking = next((c for c in refusing if c.too_large), refusing[0])
    retry = max(c.retry_s for c in refusing)
    return AdmitResult(admitted=False, refused_by=refused_label(blocking.name, blocking.key, blocking.too_large),
                       retry_after_s=retry, states=states)


@dataclass(frozen=True, slots=True)
class Observed:
    """What a store saw and did for one admission, dimension by dimension (request order)."""

    admitted: bool
    levels: Sequence[float]  # per rate: bucket level before the decision
    leases_ok: Sequence[bool]  # per concurrency limit: a lease was free (or already held)
    leases_live: Sequence[int]  # per concurrency limit: live leases after the decision
    leases_earliest: Sequence[float | None]  # per concurrency limit: earliest expiry after the decision
    windows: Sequence[tuple[float, float]]  # per budget: (previous, current) window before the decision
    # Per budget (or empty: none): an extra bound on the tokens this admission may take, valid until
    # the end of the current window (the fail-open fallback's share of what the shared store had left).
    caps: Sequence[float | None] = ()
    # Per dimension in request order (or empty: none): units other replicas hold as slices.
    claimed: Sequence[float] = ()


def bucket_admits(level: float) -> bool:
    return level >= 1.0 - EPSILON


def budget_admits(previous: float, current: float, tokens: float, limit: float, now: float, index: int,
                  window_s: int) -> bool:
    return tokens <= limit and window_estimate(previous, current, now, index, window_s) + tokens <= limit + EPSILON


def cap_admits(tokens: float, cap: float | None) -> bool:
    return cap is None or tokens <= cap + EPSILON


def decide(request: AdmitRequest, seen: Observed) -> AdmitResult:
    """The AdmitResult of an admission the store has already decided (and applied) as `seen` says.
    The store's own decision must be: every bucket level >= 1, every lease free, every budget
    `budget_admits` and `cap_admits`; this function only explains it. A budget refused by its cap
    retries at the end of the current window (the cap ends there); its remaining is the lower of the
    two bounds."""
    now, tokens, admitted = request.now, max(0, request.tokens), seen.admitted
    claimed = iter(seen.claimed or [0.0] * (len(request.rates) + len(request.concurrency) + len(request.budgets)))
    checks: list[Check] = []
    for rate, held in zip(request.rates, seen.levels, strict=True):
        level = held - next(claimed)
        ok = bucket_admits(level)
        after = level - 1.0 if admitted else level
        checks.append(Check("requests", rate.key, float(rate.burst), ok, False,
                            0.0 if ok else bucket_retry_s(level, rate.rate),
                            float(math.floor(after + EPSILON)), bucket_reset_s(after, rate.rate, rate.burst)))
    for conc, ok, leases, earliest in zip(request.concurrency, seen.leases_ok, seen.leases_live, seen.leases_earliest,
                                          strict=True):
        live = leases + next(claimed)
        wait = concurrency_retry_s(earliest, now)
        checks.append(Check("concurrency", conc.key, float(conc.limit), ok, False, 0.0 if ok else wait,
                            float(conc.limit - live), wait if live else 0.0))
    for i, (budget, (previous, counted)) in enumerate(zip(request.budgets, seen.windows, strict=True)):
        current = counted + next(claimed)
        index = window_index(now, budget.window_s)
        cap = seen.caps[i] if seen.caps else None
        big = tokens > budget.limit
        ok = budget_admits(previous, current, tokens, budget.limit, now, index, budget.window_s)
        reset = (index + 1) * budget.window_s - now
        retry = 0.0
        if big:
            retry = float(budget.window_s)
        elif not ok:
            retry = window_retry_s(previous, current, tokens, budget.limit, now, index, budget.window_s)
        if not big and not cap_admits(tokens, cap):
            ok = False
            retry = max(retry, min(float(budget.window_s), reset + RETRY_MARGIN_S))
        estimate = window_estimate(previous, current, now, index, budget.window_s)
        after = estimate + tokens if admitted else estimate
        remaining = budget.limit - after
        if cap is not None:
            remaining = min(remaining, cap - tokens if admitted else cap)
        checks.append(Check(budget_name(budget.window_s), budget.key, float(budget.limit), ok, big, retry,
                            float(math.floor(remaining + EPSILON)), reset))
    return verdict(checks)
