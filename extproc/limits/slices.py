"""Slices: the part of each busy limit this replica may admit from without asking Redis (README, "The
limits model"). Per limit key: the slice Redis granted (units left, until when it may be used: a
quarter of the ttl before Redis drops the claim), whether a call replacing it is in flight (then it is
not used), the recent demand (decayed over about a ttl: what a renewal asks for, nothing unless other
requests came meanwhile; Redis grants none below two requests), and what Redis's last decision said was
left beyond every slice (`unclaimed`, minus what the fail-open policy admitted since: `caps`). No I/O:
`RedisStore` sends and applies the replies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from extproc.limits._rules import EPSILON, budget_name, window_index
from extproc.limits.types import AdmitRequest, AdmitResult, LimitState

__all__ = ["KEEP", "Slices"]

KEEP = -1  # want of a call that leaves this replica's claim as it is (it counts as used)
_SWEEP_INTERVAL_S = 10.0
_NO_INDEX = -1


@dataclass(slots=True)
class _Slice:
    left: float = 0.0  # units this replica may still admit alone
    until: float = 0.0  # wall time after which it is not used
    renewing: bool = False  # an admission replacing the claim is in flight
    demand: float = 0.0  # units asked for recently (decayed over about one ttl)
    demand_at: float = 0.0
    unclaimed: float = 0.0  # what Redis's last decision said was left beyond every slice
    index: int = _NO_INDEX  # budget: the window of that decision (_NO_INDEX: none yet)
    reset_s: float = 0.0
    alone: float = 0.0  # units admitted by the fail-open policy since that reply


class Slices:
    def __init__(self, replica: str, ttl_s: float = 1.0) -> None:
        if ttl_s <= 0.0:
            raise ValueError(f"slice ttl must be > 0, got {ttl_s}")
        self.replica = replica
        self.ttl_s = ttl_s
        self.guard_s = ttl_s / 4.0  # recordings must reach Redis before the claim expires there
        self._keys: dict[tuple[str, str], _Slice] = {}
        self._next_sweep = 0.0
        self.local_total = 0  # admissions from a slice
        self.awaited_total = 0  # admissions decided by Redis
        self.uncovered_total = 0  # recordings whose claim Redis no longer had (expired or replaced)

    def take(self, request: AdmitRequest, again: bool = False) -> AdmitResult | None:
        """Count the request's demand; admit it from the slices if every dimension fits (and return
        the result to answer with), else None: ask Redis. `again`: Redis refused it after `take` sent it
        there (its demand is counted, it was awaited): admitted now, it counts as a slice admission."""
        now = request.now
        if now >= self._next_sweep:
            self._sweep(now)
        fits = True
        dims = self._dims(request)
        for _, entry, cost, _, _ in dims:
            if not again:
                decay = math.exp(-max(0.0, now - entry.demand_at) / self.ttl_s)
                entry.demand, entry.demand_at = entry.demand * decay + cost, now
            fits = fits and not entry.renewing and now < entry.until and entry.left + EPSILON >= cost
        if not fits:
            if not again:
                self.awaited_total += 1
            return None
        if again:
            self.awaited_total -= 1  # counted when Redis was asked; admitted from the slice after all
        self.local_total += 1
        states = []
        for (name, key), entry, cost, limit, window_s in dims:
            entry.left -= cost
            # x-ratelimit-*: this replica's estimate, what was left beyond every slice plus its own slice
            reset = (window_index(now, window_s) + 1) * window_s - now if window_s else entry.reset_s
            remaining = float(math.floor(max(0.0, entry.unclaimed + entry.left) + EPSILON))
            states.append(LimitState(name, key, limit, remaining, reset))
        return AdmitResult(admitted=True, states=tuple(states))

    def wants(self, request: AdmitRequest) -> list[int]:
        """Per dimension, what the awaited admission asks for: KEEP while another call replaces the
        claim, else a new slice of about one ttl's demand (0: give it back). Stops using the old one."""
        wants = []
        for _, entry, cost, _, _ in self._dims(request):
            if entry.renewing:
                wants.append(KEEP)
                continue
            entry.renewing, entry.left = True, 0.0
            # Busy: other requests came within about a ttl. A slice holds at least two requests.
            busy = entry.demand > cost + EPSILON
            wants.append(max(math.ceil(entry.demand), math.ceil(2 * max(1.0, cost))) if busy else 0)
        return wants

    def decided(self, request: AdmitRequest, wants: Sequence[int], states: Sequence[LimitState],
                granted: Sequence[int]) -> None:
        """Redis's decision on an awaited admission: the states (per dimension, remaining beyond other
        replicas' slices) and the units of the new slices."""
        for i, (_, entry, _, _, window_s) in enumerate(self._dims(request)):
            if wants[i] != KEEP:
                entry.renewing = False
                entry.left, entry.until = float(granted[i]), request.now + self.ttl_s - self.guard_s
            entry.unclaimed, entry.reset_s = states[i].remaining - granted[i], states[i].reset_s
            entry.index, entry.alone = window_index(request.now, window_s) if window_s else _NO_INDEX, 0.0

    def recorded(self, request: AdmitRequest, covered: Sequence[int]) -> None:
        """Redis recorded an admission from the slices: per dimension, did this replica's claim cover it.
        One that did not (the claim had expired there) stops being used."""
        if all(covered):
            return
        self.uncovered_total += 1
        for (_, entry, _, _, _), ok in zip(self._dims(request), covered, strict=True):
            if not ok:
                entry.left = 0.0

    def failed(self, request: AdmitRequest, wants: Sequence[int]) -> None:
        """The awaited admission got no answer: the claims it was replacing are not used any more."""
        for (_, entry, _, _, _), want in zip(self._dims(request), wants, strict=True):
            if want != KEEP:
                entry.renewing = False

    def caps(self, request: AdmitRequest, share: float) -> tuple[float | None, ...]:
        """Per budget, what the fail-open policy may still admit in this window: `share` of what the last
        reply said was left beyond every slice, minus what it admitted since (None: no reply this window)."""
        caps: list[float | None] = []
        for budget in request.budgets:
            entry = self._keys.get((budget_name(budget.window_s), budget.key))
            if entry is None or entry.index != window_index(request.now, budget.window_s):
                caps.append(None)
            else:
                caps.append(share * max(0.0, entry.unclaimed) - entry.alone)
        return tuple(caps) if any(cap is not None for cap in caps) else ()

    def admitted_alone(self, request: AdmitRequest) -> None:
        """The fail-open policy admitted `request`: count it against `caps`."""
        for budget in request.budgets:
            entry = self._keys.get((budget_name(budget.window_s), budget.key))
            if entry is not None:
                entry.alone += max(0, request.tokens)

    def describe(self, now: float) -> list[dict[str, object]]:
        """Per limit key: this replica's slice (units left, 0 once unusable) and what Redis's last decision
        said was left beyond every slice, minus what the fail-open policy admitted since (for /debug)."""
        return [{"name": name, "key": key, "slice": entry.left if now < entry.until else 0.0,
                 "unclaimed": entry.unclaimed, "alone": entry.alone} for (name, key), entry in self._keys.items()]

    def __len__(self) -> int:
        return len(self._keys)

    def _dims(self, request: AdmitRequest) -> list[tuple[tuple[str, str], _Slice, float, float, int]]:
        """(name, key), slice, cost, limit and window (budgets; else 0) of every dimension, in request order."""
        tokens = float(max(0, request.tokens))
        named = [(("requests", r.key), 1.0, r.burst, 0) for r in request.rates]
        named += [(("concurrency", c.key), 1.0, float(c.limit), 0) for c in request.concurrency]
        named += [((budget_name(b.window_s), b.key), tokens, float(b.limit), b.window_s) for b in request.budgets]
        keys = self._keys
        return [(dim, keys.get(dim) or keys.setdefault(dim, _Slice()), cost, limit, window_s)
                for dim, cost, limit, window_s in named]

    def _sweep(self, now: float) -> None:
        """Forget keys without a live slice, a call in flight or recent demand."""
        self._next_sweep = now + _SWEEP_INTERVAL_S
        self._keys = {dim: e for dim, e in self._keys.items()
                      if e.renewing or e.until > now or now - e.demand_at < _SWEEP_INTERVAL_S}
