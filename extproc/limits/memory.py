"""`MemoryStore`: the `Store` of one process (the embedded default, and the fail-open fallback).

The semantics are the README's ("The limits model"), computed by `_rules` and shared with `RedisStore`
(the contract tests run the same cases against both). Times are the `now` carried by each call; the
store reads no clock. A clock behind a bucket's last stamp refills nothing. `settle` applies (actual -
reserved) to the window of `reservation.admitted_at`, clamped at 0, skipped once that window no longer
counts, and only while the admission's pending marker exists (a second settle, or one of something never
admitted, changes nothing). Memory stays bounded: every `sweep_interval_s` of request time one pass drops
full buckets, expired leases, windows older than the previous one and expired markers.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from extproc.limits._rules import (
    Observed,
    bucket_admits,
    bucket_level,
    bucket_ttl_s,
    budget_admits,
    cap_admits,
    decide,
    window_index,
    window_ttl_s,
)
from extproc.limits.types import (
    AdmitRequest,
    AdmitResult,
    ConcurrencyLimit,
    RateLimit,
    Reservation,
    TokenBudget,
)

__all__ = ["MemoryStore"]


@dataclass(slots=True)
class _Bucket:
    tokens: float
    stamp: float
    expires_at: float


@dataclass(slots=True)
class _Pending:
    tokens: int
    expires_at: float


class MemoryStore:
    """In-process `Store`. Its async methods never await: one admission is atomic on the event loop."""

    def __init__(self, sweep_interval_s: float = 5.0) -> None:
        self._sweep_interval_s = sweep_interval_s
        self._next_sweep = float("-inf")
        self._buckets: dict[str, _Bucket] = {}
        # Insertion order is (almost always) expiry order, so expired leases leave from the front.
        self._leases: dict[str, OrderedDict[str, float]] = {}
        self._windows: dict[tuple[str, int, int], int] = {}
        self._pending: dict[str, _Pending] = {}

    # --- Store ----------------------------------------------------------------------------------

    async def admit(self, request: AdmitRequest) -> AdmitResult:
        return self.admit_now(request)

    async def release(self, reservation: Reservation, now: float) -> None:
        self.release_now(reservation, now)

    async def settle(self, reservation: Reservation, actual_tokens: int, now: float) -> None:
        self.settle_now(reservation, actual_tokens, now)

    async def close(self) -> None:
        return None

    # --- synchronous core (usable from sans-IO code) -----------------------------------------------

    def admit_now(self, request: AdmitRequest, caps: Sequence[float | None] = ()) -> AdmitResult:
        """`caps`: per budget (or empty), an extra bound on the tokens this admission may take (see
        `_rules.Observed.caps`)."""
        now, rid = request.now, request.request_id
        self._maybe_sweep(now)
        tokens = max(0, request.tokens)
        levels = [self._bucket_level(rate, now) for rate in request.rates]
        leases_ok = [self._lease_free(conc, rid, now) for conc in request.concurrency]
        windows = [self._window(budget, now) for budget in request.budgets]
        admitted = (all(bucket_admits(level) for level in levels) and all(leases_ok)
                    and all(budget_admits(prev, cur, tokens, b.limit, now, window_index(now, b.window_s), b.window_s)
                            for b, (prev, cur) in zip(request.budgets, windows, strict=True))
                    and all(cap_admits(tokens, cap) for cap in caps))
        if admitted:
            self._take(request, tokens, levels)
        live: list[int] = []
        earliest: list[float | None] = []
        for conc, ok in zip(request.concurrency, leases_ok, strict=True):
            leases = self._leases.get(conc.key)
            live.append(len(leases) if leases else 0)
            # The front lease expires first unless lease TTLs differ under one key; a refusal looks exactly.
            earliest.append((next(iter(leases.values())) if ok else min(leases.values())) if leases else None)
        return decide(request, Observed(admitted, levels, leases_ok, live, earliest, windows, caps))

    def release_now(self, reservation: Reservation, now: float) -> None:
        self._maybe_sweep(now)
        for conc in reservation.concurrency:
            leases = self._leases.get(conc.key)
            if leases is not None:
                leases.pop(reservation.request_id, None)
                if not leases:
                    del self._leases[conc.key]

    def settle_now(self, reservation: Reservation, actual_tokens: int, now: float) -> int | None:
        """The correction applied (actual - reserved), or None if there was nothing to settle."""
        self._maybe_sweep(now)
        pending = self._pending.pop(reservation.request_id, None)
        if pending is None or pending.expires_at <= now:
            return None
        delta = max(0, actual_tokens) - pending.tokens
        for budget in reservation.budgets:
            charged = window_index(reservation.admitted_at, budget.window_s)
            if charged < window_index(now, budget.window_s) - 1:
                continue  # that window no longer counts
            slot = (budget.key, budget.window_s, charged)
            self._windows[slot] = max(0, self._windows.get(slot, 0) + delta)
        return delta

    # --- dimensions -----------------------------------------------------------------------------

    def _bucket_level(self, rate: RateLimit, now: float) -> float:
        bucket = self._buckets.get(rate.key)
        if bucket is None or bucket.expires_at <= now:
            return bucket_level(None, now, now, rate.rate, rate.burst)[0]
        return bucket_level(bucket.tokens, bucket.stamp, now, rate.rate, rate.burst)[0]

    def _lease_free(self, conc: ConcurrencyLimit, request_id: str, now: float) -> bool:
        leases = self._leases.get(conc.key)
        if leases is None:
            return conc.limit > 0
        while leases and next(iter(leases.values())) <= now:
            leases.popitem(last=False)
        if len(leases) >= conc.limit:
            # Rare path: drop leases that expired out of insertion order before refusing.
            for rid in [rid for rid, expiry in leases.items() if expiry <= now]:
                del leases[rid]
        return len(leases) < conc.limit or request_id in leases

    def _window(self, budget: TokenBudget, now: float) -> tuple[float, float]:
        """(previous, current) windows of the budget at `now`."""
        index = window_index(now, budget.window_s)
        return (self._windows.get((budget.key, budget.window_s, index - 1), 0),
                self._windows.get((budget.key, budget.window_s, index), 0))

    def _take(self, request: AdmitRequest, tokens: int, levels: list[float]) -> None:
        now = request.now
        for rate, level in zip(request.rates, levels, strict=True):
            stamp = max(now, self._buckets[rate.key].stamp) if rate.key in self._buckets else now
            self._buckets[rate.key] = _Bucket(level - 1.0, stamp, now + bucket_ttl_s(rate.rate, rate.burst))
        for conc in request.concurrency:
            leases = self._leases.setdefault(conc.key, OrderedDict())
            leases.pop(request.request_id, None)
            leases[request.request_id] = now + conc.lease_ttl_s
        for budget in request.budgets:
            slot = (budget.key, budget.window_s, window_index(now, budget.window_s))
            self._windows[slot] = self._windows.get(slot, 0) + tokens
        if request.budgets:
            keep = max(window_ttl_s(window_index(now, b.window_s), b.window_s, now) for b in request.budgets)
            self._pending[request.request_id] = _Pending(tokens, now + keep)

    # --- bounded memory -------------------------------------------------------------------------

    def _maybe_sweep(self, now: float) -> None:
        if now < self._next_sweep:
            return
        self._next_sweep = now + self._sweep_interval_s
        self._buckets = {k: b for k, b in self._buckets.items() if b.expires_at > now}
        for key in list(self._leases):
            leases = self._leases[key]
            for rid in [rid for rid, expiry in leases.items() if expiry <= now]:
                del leases[rid]
            if not leases:
                del self._leases[key]
        self._windows = {slot: n for slot, n in self._windows.items() if slot[2] >= window_index(now, slot[1]) - 1}
        self._pending = {rid: p for rid, p in self._pending.items() if p.expires_at > now}

    def sizes(self) -> dict[str, int]:
        """Entries held, per kind (for tests and /debug)."""
        return {"buckets": len(self._buckets), "leases": sum(len(v) for v in self._leases.values()),
                "windows": len(self._windows), "pending": len(self._pending)}
