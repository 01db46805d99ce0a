"""`FlowController`: holds requests while their pool is saturated and releases them in order.

`offer` answers at once on the hot path: GO (room, nothing queued ahead), a `Rejected` (a class that
may not wait, a full queue), or a `Ticket` to await. Tickets are granted by `kick`, which the owner
calls whenever room may have appeared (a scrape arrived), or `finished` (a routed request ended), and expire at
their class's `max_wait_s` (50 ms early, see EXPIRY_MARGIN_S). Granted tickets count against the pool's
room until the request is routed (`routed`) or abandoned (`leave`), so one kick never grants more
than there is room for. A client that goes away while queued leaves at once (`leave` from the
stream's end).

The controller itself is sans-IO: time comes from the injected clock and expiry timers from the injected
`timer` (asyncio's `call_later` by default), so a test can run it in virtual time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from extproc.flow.config import FlowControlConfig
from extproc.flow.queue import FairQueue
from extproc.flow.ticket import Reason, Rejected, Room, Ticket, Timer, asyncio_timer

__all__ = ["GO", "FlowController", "Rejected", "Room", "Ticket", "Timer"]

GO: Final = "go"
# Queued requests expire this much before their class's max_wait_s (at most 10% of it), so that
# event-loop lag on a busy process does not push a wait past the limit.
EXPIRY_MARGIN_S: Final = 0.05
# A class's `reserve` applies only while its pool is saturated: while seats free up slower than one per
# RESERVE_FREED_INTERVAL_S (about an engine step: a pool filling from idle, whose requests all started together,
# frees none for a whole request's time) and, if a request queued then, until the queue empties (the first
# completions of an overload's onset must not hand the reserved seats to the lower classes queued meanwhile); or
# once requests have queued here without a break for SATURATED_AFTER_S. That was 1 s until session 11, but a burst
# at 0.9x drains at a tenth of the pool's rate: the queue lasts up to ~2 s there (virtual time, 15 seeds) while each
# request waits a few hundred ms, and reserves then (seats kept idle for critical, from 85% of the traffic) made
# the backlog last longer still (sheddable TTFT p99 540 vs 277 ms without flow control, reports/i13-s11). The
# verdict must not hang on this replica's own waits: a replica that lifts its reserves takes the seats the others
# keep, drains its queue first, and stays lifted (3 replicas at an overload that starts from a busy pool: critical
# p99 640-690 ms vs ~150). Otherwise a held higher class gets a free seat within about a step (see PROMOTE_AFTER_S),
# and the reserve would only hold lower classes while engines have seats. The rate of freed seats decays
# over FREED_TAU_S: short, so that the lull after a busy period (its requests done, the new ones not yet) shows
# within a few steps, before an overload that starts then has filled the seats kept for higher classes. With R
# service replicas each sees only its own completions, 1/R of them: the window grows R-fold, so that the estimate
# rests on as many completions as one replica's would (over FREED_TAU_S, a gap of ~160 ms in one replica's own
# completions, about 1% of its gaps at 0.9x with 3 replicas, read as a slow pool and latched the reserves).
RESERVE_FREED_INTERVAL_S: Final = 0.05
SATURATED_AFTER_S: Final = 3.0
FREED_TAU_S: Final = 0.1
# Below saturation a class without a reserve (the top class) queues in arrival order with the others, until its
# oldest request has waited this long; then it goes first again. Without that, an overload that starts from a busy
# pool (no onset to latch on) kept critical in line behind the lower classes until the reserves came back (p99
# ~1 s with them back after a 1 s wait); with it ~160-230 ms (main, always first: 56-180 ms), while at 0.9x the
# others pay +4% / +1% p99 pooled over 12 seeds for it (0.05 s: +8.5% / +5.8%; reports/i13-s11).
PROMOTE_AFTER_S: Final = 0.1
# A request that queues while seats free slower than this fraction of one per RESERVE_FREED_INTERVAL_S (one per
# 200 ms) latches the reserves until the queue empties: an overload's onset from idle frees none for a whole
# request's time; a busy pool at 0.9x (~85 seats/s) has short dips below one per 50 ms, and a latch there held the
# lower classes in strict priority order for the whole burst (session 11, locked bench, 1 replica).
LATCH_FRACTION: Final = 0.25
# The reserve of a class whose reserve does not apply now: no seat kept (`LoadModel.capacity` rounds it away), but
# above 0, so it does not probe past a learned capacity as the top class does.
_NO_RESERVE: Final = 1e-12
# While reserves do not apply (the pool is busy, not saturated), the classes are peers: the queue serves them in
# arrival order, as the engines' own queues would without flow control, so that flow control is invisible below
# saturation. With critical always first there (sessions 9-10), a 0.9x burst that filled every seat moved critical's
# wait onto the others: standard TTFT p99 +11% pooled over 12 seeds in virtual time, +53% on one (reports/i13-s11).
# A top-class request that has waited PROMOTE_AFTER_S goes first; priority order between all classes comes back
# with the reserves (`_reserving`). So does the fair share between a class's tenants: below saturation a class's
# requests leave in arrival order too (the fair share let a light standard tenant's new requests go before older
# sheddable ones, the class being ranked by its oldest: sheddable TTFT p99 +23% pooled over 6 seeds at 0.9x on
# the locked bench, 1 replica, whose standard class has 4 tenants; reports/i13-s11).


def _kept(reserve: float, reserving: bool, queued: bool) -> float:
    """The reserve a class keeps: its own while the pool is saturated, otherwise none (`_NO_RESERVE`). A class
    without one probes past a learned capacity only while nothing waits here: once requests queue, the pool is
    full as far as the service knows, and a top-class request waits in line here for the pool's next free seat
    rather than in one full engine's queue (a probe that lands there waits for that engine's next seat)."""
    if reserve <= 0:
        return _NO_RESERVE if queued else 0.0
    return reserve if reserving else _NO_RESERVE


def _levels(config: FlowControlConfig, reserving: bool, queue: FairQueue[Ticket], now: float
            ) -> dict[str, int] | None:
    """Each class's priority in the queue now: None (their own) while reserves apply, else all levelled, except a
    class without a reserve whose oldest request has waited PROMOTE_AFTER_S (its own priority again)."""
    if reserving:
        return None
    level = min(spec.priority for spec in config.classes.values())
    return {name: spec.priority if spec.reserve <= 0 and (oldest := queue.oldest(name)) is not None
            and now - oldest >= PROMOTE_AFTER_S else level for name, spec in config.classes.items()}


@dataclass(slots=True)
class _ClassStats:
    direct: int = 0
    queued: int = 0
    granted: int = 0
    left: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    max_wait_s: float = 0.0


@dataclass(slots=True)
class _Pool:
    queue: FairQueue[Ticket]
    pending: int = 0  # granted, not yet routed
    saturated: bool = False
    freed_per_s: float = 0.0  # routed requests finished per second (decaying over FREED_TAU_S), at freed_at
    freed_at: float = 0.0
    held_since: float = -1.0  # since when requests have been queued here without a break (-1: none queued)
    longest_held_s: float = 0.0  # the longest such stretch so far (for /debug/flow)
    latched: bool = False  # a request queued while seats freed very slowly: saturated until the queue empties
    reserving: dict[str, int] = field(default_factory=dict)  # decisions taken with the reserves on, by reason
    stale_decisions: int = 0  # offers decided on stale/missing metrics
    classes: dict[str, _ClassStats] = field(default_factory=dict)

    def stats(self, klass: str) -> _ClassStats:
        entry = self.classes.get(klass)
        if entry is None:
            entry = self.classes[klass] = _ClassStats()
        return entry


class FlowController:
    def __init__(self, config: Callable[[], FlowControlConfig], room: Callable[[str, float, float, float], Room],
                 clock: Callable[[], float] = time.monotonic,
                 observe_wait: Callable[[str, float], None] | None = None, timer: Timer = asyncio_timer) -> None:
        """`config()`: the current policy's flow control, read at each use (a reload needs no call here:
        queued requests keep their class and deadline, new ones use the new classes). `room(pool, now,
        reserve, enough)`: the pool's room for a class keeping `reserve` of every endpoint's capacity free, from
        live endpoint state (see `extproc.endpoints.load`), counted at least up to `enough` (`Room.of`)."""
        self._config = config
        self._room = room
        self._clock = clock
        self._timer = timer
        self._observe_wait = observe_wait
        self._pools: dict[str, _Pool] = {}
        # Service replicas sharing the pools (the fleet sync's count, set by the app): each sees only its own
        # completions, so a pool's rate of freed seats is estimated as this replica's times this.
        self.replicas: Callable[[], int] = lambda: 1
        # Called with the pool's name when a request is held for a pool without a ready endpoint (a rare path:
        # the autoscaler and the sleep manager learn at once that the pool must wake up).
        self.cold_listeners: list[Callable[[str], None]] = []

    @property
    def config(self) -> FlowControlConfig:
        return self._config()

    def _pool(self, name: str) -> _Pool:
        pool = self._pools.get(name)
        if pool is None:
            pool = self._pools[name] = _Pool(FairQueue[Ticket](self.config.aging_per_s))
        return pool

    # -- hot path ----------------------------------------------------------------------------------
    def offer(self, pool_name: str, tenant: str, klass: str, tokens: int, weight: float = 1.0
              ) -> Literal["go"] | Ticket | Rejected:
        pool = self._pool(pool_name)
        spec = self.config.classes[klass]
        now = self._clock()
        if pool.queue:
            self._dispatch(pool_name, pool, now)
        # Whatever is still queued had no room for its class; room for this one means nothing of a
        # class with at most its reserve waits ahead of it.
        reserving = self._reserving(pool, now)
        reserve = _kept(spec.reserve, reserving, bool(pool.queue))
        room = self._room(pool_name, now, reserve, pool.pending + 1.0)
        if room.stale:
            pool.stale_decisions += 1
        pool.saturated = room.cold_s > 0 or room.requests - pool.pending <= 0
        if not pool.saturated and not self._ahead(pool, klass, reserve, reserving):
            pool.stats(klass).direct += 1
            return GO
        wait_s = max(spec.max_wait_s, room.cold_s)
        if wait_s <= 0:
            return self._rejected(pool, klass, "saturated", 0.0)
        if len(pool.queue) >= self.config.max_queued:
            lowest = pool.queue.lowest()
            if lowest is None or lowest.priority >= spec.priority:
                return self._rejected(pool, klass, "queue_full", 0.0)
            self._evict(pool, lowest, now)
        ticket = Ticket(pool_name, tenant, klass, spec.priority, max(weight, 1e-6), max(1, tokens), now,
                        now + wait_s)
        ticket.cold = room.cold_s > 0
        ticket.arm(self._timer, max(0.0, wait_s - min(EXPIRY_MARGIN_S, 0.1 * wait_s)), self._expire)
        pool.queue.push(ticket)
        if self._freed_slowly(pool, now, LATCH_FRACTION):
            pool.latched = True
        self._track(pool, now)
        pool.stats(klass).queued += 1
        if ticket.cold:
            for listener in self.cold_listeners:
                listener(pool_name)
        return ticket

    def routed(self, ticket: Ticket) -> None:
        """The granted request was routed: it now shows in the endpoints' in-flight counts."""
        if ticket.granted and not ticket.consumed:
            ticket.consumed = True
            self._pool(ticket.pool).pending -= 1

    def leave(self, ticket: Ticket) -> None:
        """The exchange ended (normally, or the client went away): give back whatever it still holds."""
        pool = self._pool(ticket.pool)
        if pool.queue.remove(ticket):
            self._track(pool, self._clock())
            pool.stats(ticket.klass).left += 1
            ticket.settle(Rejected(ticket.klass, "left", 499, 0.0, self._clock() - ticket.enqueued))
        elif ticket.granted and not ticket.consumed:
            ticket.consumed = True
            pool.pending -= 1
            self._dispatch(ticket.pool, pool, self._clock())

    # -- releasing ---------------------------------------------------------------------------------
    def kick(self, pool_name: str) -> None:
        """Room may have appeared in `pool_name`: grant queued requests while it lasts."""
        pool = self._pools.get(pool_name)
        if pool is not None and pool.queue:
            self._dispatch(pool_name, pool, self._clock())

    def kick_all(self) -> None:
        for name in [n for n, p in self._pools.items() if p.queue]:
            self.kick(name)

    def queued(self, pool_name: str | None = None) -> int:
        if pool_name is not None:
            pool = self._pools.get(pool_name)
            return len(pool.queue) if pool is not None else 0
        return sum(len(p.queue) for p in self._pools.values())

    def finished(self, pool_name: str) -> None:
        """A request routed to `pool_name` ended: its seat is free (counted for `_reserve`); grants what fits."""
        pool = self._pool(pool_name)
        now = self._clock()
        pool.freed_per_s = self._freed_per_s(pool, now) + 1.0 / self._freed_tau_s()
        pool.freed_at = now
        if pool.queue:
            self._dispatch(pool_name, pool, now)

    @staticmethod
    def _track(pool: _Pool, now: float) -> None:
        """After the queue changed: since when it has held requests without a break."""
        if pool.held_since >= 0:
            pool.longest_held_s = max(pool.longest_held_s, now - pool.held_since)
        if not pool.queue:
            pool.held_since = -1.0
            pool.latched = False
        elif pool.held_since < 0:
            pool.held_since = now

    def _freed_tau_s(self) -> float:
        return FREED_TAU_S * max(1, self.replicas())

    def _freed_per_s(self, pool: _Pool, now: float) -> float:
        """This replica's rate of freed seats (decaying over FREED_TAU_S per replica)."""
        return pool.freed_per_s * math.exp(-max(0.0, now - pool.freed_at) / self._freed_tau_s())

    def _freed_slowly(self, pool: _Pool, now: float, fraction: float = 1.0) -> bool:
        """Seats of the pool free slower than `fraction` per RESERVE_FREED_INTERVAL_S, over all service replicas."""
        return self._freed_per_s(pool, now) * max(1, self.replicas()) * RESERVE_FREED_INTERVAL_S < fraction

    def _reserving(self, pool: _Pool, now: float) -> bool:
        """Whether classes keep their reserves now: while the pool is saturated (see RESERVE_FREED_INTERVAL_S),
        not while seats free often and nothing has queued for long (a busy pool below saturation). Counted per
        reason in `reserving` (/debug/flow)."""
        reason = ("latched" if pool.latched else "slow" if self._freed_slowly(pool, now)
                  else "queue" if pool.held_since >= 0 and now - pool.held_since >= SATURATED_AFTER_S else None)
        if reason is not None:
            pool.reserving[reason] = pool.reserving.get(reason, 0) + 1
        return reason is not None

    def _ahead(self, pool: _Pool, klass: str, reserve: float, reserving: bool) -> bool:
        """A queued request that must go before a new one of this class (same reserve, higher or equal
        priority in the queue now: it had no room and neither would this one)."""
        if not pool.queue:
            return False
        classes = self.config.classes
        levels = _levels(self.config, reserving, pool.queue, self._clock())
        priority = classes[klass].priority if levels is None else levels[klass]
        return any(pool.queue.queued(name) and (spec.priority if levels is None else levels[name]) >= priority
                   and _kept(spec.reserve, reserving, True) <= reserve for name, spec in classes.items())

    def _dispatch(self, pool_name: str, pool: _Pool, now: float) -> None:
        """Grant queued requests in rank order while their class has room. A class without room does not
        block the classes after it: one with a smaller reserve (a higher class) may still fit."""
        rooms: dict[float, float] = {}
        granted = True
        reserving = self._reserving(pool, now)  # granting changes none of what it reads
        pool.queue.aging_per_s = self.config.aging_per_s
        while granted and pool.queue:
            granted = False
            for klass in pool.queue.ranked(now, _levels(self.config, reserving, pool.queue, now)):
                spec = self.config.classes.get(klass)
                reserve = _kept(spec.reserve if spec is not None else 0.0, reserving, True)
                if reserve not in rooms:
                    rooms[reserve] = self._room(pool_name, now, reserve, math.inf).requests - pool.pending
                if rooms[reserve] <= 0:
                    continue
                ticket = pool.queue.pop_class(klass, oldest=not reserving)
                if ticket is None:
                    continue
                self._grant(pool, ticket, now)
                rooms = {r: left - 1 for r, left in rooms.items()}
                granted = True
                break
        self._track(pool, now)
        pool.saturated = bool(pool.queue)

    def _grant(self, pool: _Pool, ticket: Ticket, now: float) -> None:
        waited = now - ticket.enqueued
        stats = pool.stats(ticket.klass)
        stats.granted += 1
        stats.max_wait_s = max(stats.max_wait_s, waited)
        if self._observe_wait is not None:
            self._observe_wait(ticket.klass, waited)
        pool.pending += 1
        ticket.settle(None)

    def _expire(self, ticket: Ticket) -> None:
        pool = self._pools.get(ticket.pool)
        if pool is None or not pool.queue.remove(ticket):
            return
        self._track(pool, self._clock())
        waited = self._clock() - ticket.enqueued
        if self._observe_wait is not None:
            self._observe_wait(ticket.klass, waited)
        ticket.settle(self._rejected(pool, ticket.klass, "cold_start" if ticket.cold else "timeout", waited))

    def _evict(self, pool: _Pool, ticket: Ticket, now: float) -> None:
        pool.queue.remove(ticket)
        ticket.settle(self._rejected(pool, ticket.klass, "displaced", now - ticket.enqueued))

    def _rejected(self, pool: _Pool, klass: str, reason: Reason, waited: float) -> Rejected:
        stats = pool.stats(klass)
        stats.rejected[reason] = stats.rejected.get(reason, 0) + 1
        stats.max_wait_s = max(stats.max_wait_s, waited)
        spec = self.config.classes.get(klass)
        # No endpoint came up in time: a capacity failure, never the client's rate (always 503).
        status = spec.reject_status if spec is not None and reason != "cold_start" else 503
        return Rejected(klass, reason, status, self.config.retry_after_s, waited)

    # -- introspection -----------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Per pool: queued per class, pending grants, saturation, per-class counters (for /debug/flow)."""
        return {
            name: {
                "saturated": pool.saturated,
                "queued": pool.queue.sizes(),
                "pending_grants": pool.pending,
                "stale_decisions": pool.stale_decisions,
                "longest_queue_s": round(pool.longest_held_s, 3),
                "reserving": dict(pool.reserving),
                "classes": {
                    klass: {"direct": s.direct, "queued": s.queued, "granted": s.granted, "left": s.left,
                            "rejected": dict(s.rejected), "max_wait_s": round(s.max_wait_s, 4)}
                    for klass, s in pool.classes.items()
                },
            }
            for name, pool in self._pools.items()
        }
