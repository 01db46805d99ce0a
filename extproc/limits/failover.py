"""`FailoverStore`: a shared primary store (Redis) with a policy for when it is down or slow.

Each admission waits at most `deadline_ms` for the primary (None: the primary bounds its admissions
itself, as `RedisStore(admit_timeout_ms=...)` does on the reply, so that a reply read in the loop
iteration where the deadline passes is not thrown away). On `StoreUnavailable` or that deadline:
  - "fail-open": the fallback store (a per-replica `MemoryStore`) decides. Limits travel in each
    request, so the fallback sees them scaled by `fallback_share` (the caller passes 1 / replicas):
    rates and burst, concurrency and budgets are multiplied (rounded up, at least 1), so the fleet
    stays near its limits while Redis is away. A share alone is blind to what the fleet already
    took: each token budget is also capped, until the end of its current window, by this replica's share
    of what the primary last reported remaining for it (`LimitState.remaining` of this replica's latest
    primary admission in that window) minus the tokens admitted locally since (`Reports`), so the
    replicas deciding alone together stay within what was left;
  - "fail-closed": refused with refused_by="store_unavailable" and `retry_after_s`.
After a failure the primary is marked down and not asked again until `probe_backoff_s` has passed;
then one admission probes it (others keep using the policy meanwhile) and success marks it up. A late
reply (`StoreTimeout`, or the deadline here) marks it down only after `down_after_timeouts` in a row
spanning at least `down_after_s`: late replies around a scheduling hiccup on a busy node (several
admissions in flight time out together) have those admissions decided by the policy, and the next ones
ask the primary again. Any other failure (refused connection, lost connection,
server error) marks it down at once.
One log line per change of state (down / up); `failures_total` counts every failed primary call.

Reservations remember where they were admitted: release/settle of a fallback admission go to the
fallback, all others to the primary (bounded by `cleanup_deadline_ms`, or by the primary itself when
None, as `RedisStore` bounds every call by its client timeout; tried even while it is marked down so
leases are not left to expire). A failing release/settle is logged and counted, never raised:
its leases expire by TTL and its reservation stays at the estimate. `record_failure` counts failures
the primary only learns of later (a posted call whose reply was an error).

Replay: the tokens of fallback admissions (reserved, then corrected when settled) are owed to the
primary. After the primary answers an admission again, one background `charge` (a primary that is a
`ChargeableStore`) adds them to its windows, so the shared budget accounts for them; windows that no
longer count are dropped. A failed replay is kept and retried after the next primary success (at
least once: a replay that timed out may have been applied, and is then counted twice).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from extproc.limits._rules import budget_name, window_index
from extproc.limits.memory import MemoryStore
from extproc.limits.types import (
    AdmitRequest,
    AdmitResult,
    ChargeableStore,
    Reservation,
    Store,
    StoreTimeout,
    StoreUnavailable,
    WindowCharge,
)

__all__ = ["STORE_UNAVAILABLE", "FailoverStore", "Policy", "Reports", "share_of"]

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


@dataclass(slots=True)
class _Report:
    index: int  # the window it belongs to
    remaining: float  # what the primary said was left in that window
    since: int = 0  # tokens admitted locally after it


class Reports:
    """What the primary last reported left in each token budget, and what was admitted locally since:
    the cap of the fallback's decisions in the same window."""

    def __init__(self) -> None:
        self._latest: dict[tuple[str, int], _Report] = {}

    def remember(self, request: AdmitRequest, result: AdmitResult) -> None:
        """Keep the budgets' states of a primary decision (they are the last len(budgets) states)."""
        budgets, states = request.budgets, result.states
        offset = len(states) - len(budgets)
        if not budgets or offset < 0:
            return
        for i, budget in enumerate(budgets):
            state = states[offset + i]
            if state.key != budget.key or state.name != budget_name(budget.window_s):
                return  # not the shape a store reports: nothing to learn
            index = window_index(request.now, budget.window_s)
            report = self._latest.get((budget.key, budget.window_s))
            if report is None:
                self._latest[(budget.key, budget.window_s)] = _Report(index, state.remaining)
            else:
                report.index, report.remaining, report.since = index, state.remaining, 0

    def caps(self, request: AdmitRequest, share: float = 1.0) -> tuple[float | None, ...]:
        """Per budget: tokens the fallback may still admit in this window (`share` of what the primary last
        reported left, minus what was admitted locally since), or None (no report for it)."""
        caps: list[float | None] = []
        for budget in request.budgets:
            report = self._latest.get((budget.key, budget.window_s))
            if report is None or report.index != window_index(request.now, budget.window_s):
                caps.append(None)
            else:
                caps.append(share * report.remaining - report.since)
        return tuple(caps) if any(cap is not None for cap in caps) else ()

    def admitted_locally(self, request: AdmitRequest) -> None:
        tokens = max(0, request.tokens)
        for budget in request.budgets:
            report = self._latest.get((budget.key, budget.window_s))
            if report is not None and report.index == window_index(request.now, budget.window_s):
                report.since += tokens

    def sweep(self, now: float) -> None:
        """Forget reports of windows that are over."""
        self._latest = {key: r for key, r in self._latest.items() if r.index >= window_index(now, key[1])}

    def __len__(self) -> int:
        return len(self._latest)


class FailoverStore:
    def __init__(self, primary: Store, fallback: MemoryStore, policy: Policy, deadline_ms: float | None = 5.0,
                 retry_after_s: float = 1.0, *, fallback_share: float = 1.0, probe_backoff_s: float = 1.0,
                 cleanup_deadline_ms: float | None = 50.0, down_after_timeouts: int = 3, down_after_s: float = 0.1,
                 clock: Callable[[], float] = time.monotonic, logger: logging.Logger | None = None) -> None:
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
        self._deadline_s = deadline_ms / 1000.0 if deadline_ms is not None else None
        self._cleanup_deadline_s = cleanup_deadline_ms / 1000.0 if cleanup_deadline_ms is not None else None
        self._retry_after_s = retry_after_s
        self._backoff_s = probe_backoff_s
        self._clock = clock
        self._log = logger or logging.getLogger(__name__)
        self._down_since: float | None = None
        self._next_probe = 0.0
        self._on_fallback: dict[str, float] = {}  # request_id -> when we may forget it (clock)
        self._next_sweep = 0.0
        self.reports = Reports()
        self._owed: dict[tuple[str, int, int], int] = {}  # (budget key, window_s, index) -> tokens
        self._charger = primary if isinstance(primary, ChargeableStore) else None
        self._replay: asyncio.Task[None] | None = None
        self.replayed_tokens_total = 0  # fallback tokens added to the primary's windows

    @property
    def primary_up(self) -> bool:
        return self._down_since is None

    async def admit(self, request: AdmitRequest) -> AdmitResult:
        self._sweep(request.now)
        if self._may_ask_primary():
            try:
                async with asyncio.timeout(self._deadline_s):
                    result = await self._primary.admit(request)
            except (StoreTimeout, TimeoutError) as exc:
                self._late(exc)
            except StoreUnavailable as exc:
                self._failed("admit", exc)
            else:
                self._succeeded(request.now)
                self.reports.remember(request, result)
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
            delta = self._fallback.settle_now(reservation, actual_tokens, now)
            if delta:
                for b in reservation.budgets:
                    self._owe(b.key, b.window_s, window_index(reservation.admitted_at, b.window_s), delta)
            return
        try:
            async with asyncio.timeout(self._cleanup_deadline_s):
                await self._primary.settle(reservation, actual_tokens, now)
        except (StoreUnavailable, TimeoutError) as exc:
            self._failed("settle", exc)

    async def close(self) -> None:
        if self._replay is not None:
            self._replay.cancel()
            await asyncio.gather(self._replay, return_exceptions=True)
        try:
            await self._primary.close()
        finally:
            await self._fallback.close()

    def record_failure(self, call: str, reason: str) -> None:
        """A primary call that failed after it returned (e.g. a posted release whose reply was an error)."""
        self._failed(call, StoreUnavailable(reason))

    async def replayed(self) -> None:
        """Wait for the replay in progress, if any."""
        if self._replay is not None:
            await asyncio.gather(self._replay, return_exceptions=True)

    @property
    def owed_tokens(self) -> int:
        """Tokens admitted by the fallback that the primary has not been told about yet."""
        return sum(self._owed.values())

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

    def _succeeded(self, now: float) -> None:
        self._timeouts_in_a_row = 0
        if self._down_since is not None:
            self._log.warning("limits store up again after %.1fs", self._clock() - self._down_since)
            self._down_since = None
        if self._owed and self._charger is not None and self._replay is None:
            self._replay = asyncio.get_running_loop().create_task(self._replay_owed(self._charger, now))

    async def _replay_owed(self, charger: ChargeableStore, now: float) -> None:
        owed, self._owed = self._owed, {}
        charges = [WindowCharge(key, window_s, index, tokens) for (key, window_s, index), tokens in owed.items()
                   if tokens and index >= window_index(now, window_s) - 1]
        try:
            if charges:
                async with asyncio.timeout(self._cleanup_deadline_s):
                    await charger.charge(charges, now)
        except (StoreUnavailable, TimeoutError) as exc:
            self._failed("charge", exc)
            for charge in charges:
                self._owe(charge.key, charge.window_s, charge.index, charge.tokens)
        else:
            self.replayed_tokens_total += sum(charge.tokens for charge in charges)
        finally:
            self._replay = None

    def _owe(self, key: str, window_s: int, index: int, tokens: int) -> None:
        slot = (key, window_s, index)
        self._owed[slot] = self._owed.get(slot, 0) + tokens

    async def _degraded(self, request: AdmitRequest) -> AdmitResult:
        self.degraded_admits_total += 1
        if self.policy == "fail-closed":
            return AdmitResult(admitted=False, refused_by=STORE_UNAVAILABLE, retry_after_s=self._retry_after_s)
        result = self._fallback.admit_now(share_of(request, self._share), self.reports.caps(request, self._share))
        if result.admitted and (request.concurrency or request.budgets):
            self.reports.admitted_locally(request)
            tokens = max(0, request.tokens)
            for b in request.budgets:
                self._owe(b.key, b.window_s, window_index(request.now, b.window_s), tokens)
            horizon = max([c.lease_ttl_s for c in request.concurrency] + [2.0 * b.window_s for b in request.budgets])
            self._on_fallback[request.request_id] = self._clock() + horizon
        return result

    def _sweep(self, wall: float) -> None:
        now = self._clock()
        if now < self._next_sweep:
            return
        self._next_sweep = now + _SWEEP_INTERVAL_S
        self._on_fallback = {rid: until for rid, until in self._on_fallback.items() if until > now}
        self.reports.sweep(wall)
        self._owed = {slot: tokens for slot, tokens in self._owed.items() if slot[2] >= window_index(wall, slot[1]) - 1}
