"""Endpoint health: a circuit breaker per endpoint fed by passive outcomes and active scrapes.

closed --(N consecutive failures)--> open (ejected for base * 2^(ejections-1), capped)
open --(ejection time over)--> half-open: exactly one probe request is let through
half-open --(probe ok)--> closed ; --(probe fails)--> open again, for longer

A pool never has more than `max_ejected_percent` of its endpoints ejected by passive failures, so one
bad signal cannot empty a pool. Endpoints whose metrics scrapes keep failing (refused, timed out) are
unavailable too: that is the active check, and it recovers as soon as a scrape succeeds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from extproc.endpoints.config import HealthPolicy
from extproc.endpoints.registry import Endpoint


@dataclass(slots=True, eq=False)
class Breaker:
    failures: int = 0  # consecutive
    ejected_until: float = 0.0
    ejections: int = 0
    probing: bool = False  # a half-open probe is in flight

    def state(self, now: float) -> str:
        if self.ejected_until > now:
            return "open"
        return "half-open" if self.ejections else "closed"


class HealthTracker:
    """Breakers by endpoint address; plain state, driven by the gateway with an injected clock. The rules come
    from `policy()`, read at each use: the current policy's, with no reconfiguration on reload."""

    def __init__(self, policy: Callable[[], HealthPolicy] = HealthPolicy) -> None:
        self._policy = policy
        self._breakers: dict[str, Breaker] = {}
        self.ejections_total = 0

    def breaker(self, address: str) -> Breaker:
        found = self._breakers.get(address)
        if found is None:
            found = self._breakers[address] = Breaker()
        return found

    def record(self, address: str, ok: bool, now: float, pool: Sequence[Endpoint] = ()) -> bool:
        """An outcome of a request served by `address`; returns True when this ejected it."""
        breaker = self.breaker(address)
        breaker.probing = False
        if ok:
            breaker.failures = 0
            if breaker.ejected_until <= now:
                breaker.ejections = 0
            return False
        breaker.failures += 1
        config = self._policy()
        half_open = breaker.ejections > 0 and breaker.ejected_until <= now
        if breaker.failures < config.consecutive_failures and not half_open:
            return False
        if breaker.ejected_until > now or not self._may_eject(pool, now, config.max_ejected_percent):
            return False
        breaker.ejections += 1
        duration = min(config.max_ejection_s, config.base_ejection_s * 2 ** (breaker.ejections - 1))
        breaker.ejected_until = now + duration
        self.ejections_total += 1
        return True

    def _may_eject(self, pool: Sequence[Endpoint], now: float, max_percent: float) -> bool:
        if not pool:
            return True
        ejected = sum(1 for e in pool if self.breaker(e.address).ejected_until > now)
        return (ejected + 1) * 100.0 <= max_percent * len(pool)

    def available(self, endpoint: Endpoint, now: float) -> bool:
        return self._available(endpoint, now, self._policy().scrape_failures)

    def _available(self, endpoint: Endpoint, now: float, scrape_failures: int) -> bool:
        if endpoint.scrape_failures >= scrape_failures:
            return False
        breaker = self._breakers.get(endpoint.address)
        if breaker is None or breaker.ejections == 0:
            return True
        if breaker.ejected_until > now:
            return False
        return not breaker.probing  # half-open: one probe at a time

    def usable(self, endpoints: Sequence[Endpoint], now: float) -> list[Endpoint]:
        limit = self._policy().scrape_failures
        return [e for e in endpoints if self._available(e, now, limit)]

    def each_usable(self, endpoints: Sequence[Endpoint], now: float) -> Iterator[Endpoint]:
        """`usable`, lazily (for callers that may stop early)."""
        limit = self._policy().scrape_failures
        return (e for e in endpoints if self._available(e, now, limit))

    def picked(self, endpoint: Endpoint, now: float) -> None:
        """The gateway routed to `endpoint`; a half-open breaker now has its probe in flight."""
        breaker = self._breakers.get(endpoint.address)
        if breaker is not None and breaker.ejections and breaker.ejected_until <= now:
            breaker.probing = True

    def states(self, now: float) -> dict[str, str]:
        return {address: b.state(now) for address, b in self._breakers.items()}
