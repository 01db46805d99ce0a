"""Optimistic admission: admit without waiting for the shared store while it has ample room.

An admission through Redis is one atomic round trip (`RedisStore.admit`). Awaiting it puts the round
trip (and waking redis-server on a busy node) on every request's latency, although most tenants are
nowhere near their limits most of the time. `Headroom` remembers what the store last answered for each
limit key (a token bucket, a lease set, a budget window) and what this process has sent since. When
every dimension of a request fits with room to spare, the store posts the admission with `force`
(the script takes every dimension even if one would refuse) and the request goes on at once; the
reply, when it comes, becomes the newest report. Near a limit (or without a recent report) the
admission is awaited and decided by Redis as before, so the exact decisions happen where they matter.

Rule, per dimension of the request (cost 1 for a bucket or a lease set, the reserved tokens for a budget):

    in_flight + cost <= share x remaining

where `remaining` is from the newest reply for that key (at most `max_age_s` old, and for a budget from
the current window), and `in_flight` is every admission this process sent after that reply was sent
and has no reply for yet (awaited ones included, as if admitted). The service uses `share` = 1 / (2 x
replicas): together the replicas run ahead of the store by at most half of what it last said was left.
Replies carry a send sequence, so an older reply applied late (an awaited one resumes after posted
replies that arrived with it) never replaces a newer report. Releases and settles posted after a report
are credited to it at once (the lease freed, reserved minus used tokens given back) when the report is
of the window they touch: either exact or (if the store had not yet seen the admission) conservative.

Tolerance: Redis accounts every admission exactly (forced or not); an optimistic admission overshoots a
limit only if, while it was in flight, other replicas' admissions took what it was counting on (a burst of
more than the whole remaining budget within one round trip). The
reply says whether the store would have refused it (`overshoots` counts those). The states returned for
x-ratelimit-* headers are this process's estimate (report minus in-flight minus this request).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from extproc.limits._rules import EPSILON, bucket_reset_s, budget_name, window_index
from extproc.limits.types import AdmitRequest, AdmitResult, LimitState, Reservation

__all__ = ["Headroom"]

_SWEEP_INTERVAL_S = 10.0
_NO_INDEX = -1


@dataclass(slots=True)
class _Key:
    """What the store last said of one limit key, and what was sent since."""

    in_flight: float = 0.0
    seq: int = -1  # send sequence of the reply `remaining` comes from (-1: none yet)
    sent_at: float = 0.0  # request.now of that admission (wall clock)
    index: int = _NO_INDEX  # budget: the window the report is of
    remaining: float = 0.0
    reset_s: float = 0.0


class Headroom:
    def __init__(self, share: float = 1.0, max_age_s: float = 0.5) -> None:
        if not 0.0 < share <= 1.0:
            raise ValueError(f"share must be in (0, 1], got {share}")
        if max_age_s <= 0.0:
            raise ValueError(f"max_age_s must be > 0, got {max_age_s}")
        self.share = share
        self.max_age_s = max_age_s
        self._keys: dict[tuple[str, str], _Key] = {}
        self._seq = 0
        self._next_sweep = 0.0
        self.optimistic_total = 0  # admissions taken without waiting
        self.awaited_total = 0  # admissions that waited for the store
        self.overshoots_total = 0  # optimistic admissions the store would have refused

    def take(self, request: AdmitRequest) -> tuple[int, AdmitResult | None]:
        """Count `request` as sent; return its send sequence and, if it may be admitted without waiting,
        the result to answer with (else None: await the store)."""
        now = request.now
        if now >= self._next_sweep:
            self._sweep(now)
        self._seq += 1
        seq, share, max_age = self._seq, self.share, self.max_age_s
        keys = self._keys
        fits = True
        left: list[tuple[float, float]] = []  # per dimension: remaining after this request, reset
        for dim, cost, index in self._dims(request):
            entry = keys.get(dim)
            if entry is None:
                entry = keys[dim] = _Key()
            if fits:
                if (entry.seq < 0 or now - entry.sent_at > max_age or entry.index != index
                        or entry.in_flight + cost > share * entry.remaining + EPSILON):
                    fits = False
                else:
                    left.append((entry.remaining - entry.in_flight - cost, entry.reset_s))
            entry.in_flight += cost
        if not fits:
            self.awaited_total += 1
            return seq, None
        self.optimistic_total += 1
        return seq, AdmitResult(admitted=True, states=self._finish(request, left))

    def replied(self, request: AdmitRequest, seq: int, states: tuple[LimitState, ...] | None,
                overshoot: bool = False) -> None:
        """The store's states after the admission sent as `seq`, one per dimension in request order as
        a store reports them (None: it failed, nothing learned); `overshoot`: an optimistic admission
        the store would have refused."""
        if overshoot:
            self.overshoots_total += 1
        for i, (dim, cost, index) in enumerate(self._dims(request)):
            entry = self._keys.get(dim)
            if entry is None:
                continue
            entry.in_flight = max(0.0, entry.in_flight - cost)
            if states is None or seq <= entry.seq:
                continue
            state = states[i]
            entry.seq, entry.sent_at, entry.index = seq, request.now, index
            entry.remaining, entry.reset_s = state.remaining, state.reset_s

    def released(self, reservation: Reservation) -> None:
        """Leases released: give each back to its report."""
        for c in reservation.concurrency:
            entry = self._keys.get(("concurrency", c.key))
            if entry is not None and entry.seq >= 0:
                entry.remaining = min(float(c.limit), entry.remaining + 1.0)

    def settled(self, reservation: Reservation, actual_tokens: int) -> None:
        """Reserved tokens corrected to `actual_tokens`: apply the difference to reports of that window."""
        delta = float(max(0, actual_tokens) - max(0, reservation.tokens))
        if not delta:
            return
        for b in reservation.budgets:
            entry = self._keys.get((budget_name(b.window_s), b.key))
            if entry is not None and entry.index == window_index(reservation.admitted_at, b.window_s):
                entry.remaining = max(0.0, min(float(b.limit), entry.remaining - delta))

    def __len__(self) -> int:
        return len(self._keys)

    @staticmethod
    def _dims(request: AdmitRequest) -> list[tuple[tuple[str, str], float, int]]:
        """(name, key), cost, window index (budgets; else -1) of every dimension, in request order."""
        tokens = float(max(0, request.tokens))
        dims = [(("requests", r.key), 1.0, _NO_INDEX) for r in request.rates]
        dims += [(("concurrency", c.key), 1.0, _NO_INDEX) for c in request.concurrency]
        dims += [((budget_name(b.window_s), b.key), tokens, window_index(request.now, b.window_s))
                 for b in request.budgets]
        return dims

    @staticmethod
    def _finish(request: AdmitRequest, left: list[tuple[float, float]]) -> tuple[LimitState, ...]:
        """The estimated states in the shape a store reports (limit, floored remaining, reset), from
        each dimension's (remaining, last reported reset) in request order."""
        out: list[LimitState] = []
        it = iter(left)
        for r in request.rates:
            remaining, _ = next(it)
            whole = math.floor(max(0.0, remaining) + EPSILON)
            out.append(LimitState("requests", r.key, float(r.burst), float(whole),
                                  bucket_reset_s(whole, r.rate, r.burst)))
        for c in request.concurrency:
            remaining, reset = next(it)
            out.append(LimitState("concurrency", c.key, float(c.limit), max(0.0, remaining), reset))
        for b in request.budgets:
            remaining, _ = next(it)
            reset = (window_index(request.now, b.window_s) + 1) * b.window_s - request.now
            out.append(LimitState(budget_name(b.window_s), b.key, float(b.limit),
                                  float(math.floor(max(0.0, remaining) + EPSILON)), reset))
        return tuple(out)

    def _sweep(self, now: float) -> None:
        """Forget keys with nothing in flight whose report is too old to use."""
        self._next_sweep = now + _SWEEP_INTERVAL_S
        self._keys = {dim: e for dim, e in self._keys.items()
                      if e.in_flight > 0.0 or (e.seq >= 0 and now - e.sent_at <= self.max_age_s)}
