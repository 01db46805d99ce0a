"""The admission queue of one pool: strict priority between classes with aging, fair share within one.

Pure data structure, no I/O and no clock of its own (callers pass `now`).

Between classes the next request comes from the class with the highest *effective* priority:
its priority plus `aging_per_s` points for every second its oldest request has waited, so a lower
class is never starved forever (ties go to the class whose oldest request is older). The owner may
give classes other priorities for one ranking (`ranked`): classes given the same one are served in
arrival order.

Within a class, tenants share by weighted tokens (virtual token counters, after Sheng et al.,
"Fairness in Serving Large Language Models", OSDI 2024): each tenant's counter grows by the
request's estimated tokens / the tenant's weight when it is dispatched, and the backlogged tenant
with the smallest counter goes next, so a heavy tenant cannot crowd out the others. A tenant that
becomes backlogged again starts at the current minimum (no credit saved up while idle, no debt
from before); counters of a class are dropped whenever that class's queue empties.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["FairQueue", "Waiter"]

_MAX_COUNTERS = 10_000


@dataclass(slots=True, eq=False)
class Waiter:
    """One queued request."""

    tenant: str
    klass: str
    priority: int
    weight: float
    tokens: int
    enqueued: float
    deadline: float
    queued: bool = True  # False once popped, removed or evicted


W = TypeVar("W", bound=Waiter)


@dataclass(slots=True)
class _Class(Generic[W]):
    name: str
    priority: int
    tenants: dict[str, deque[W]] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    size: int = 0

    def oldest(self) -> W | None:
        best: W | None = None
        for waiters in self.tenants.values():
            if waiters and (best is None or waiters[0].enqueued < best.enqueued):
                best = waiters[0]
        return best


class FairQueue(Generic[W]):
    """Queued requests of type W (a `Waiter`, or a subclass carrying what its owner needs)."""

    def __init__(self, aging_per_s: float = 0.0) -> None:
        self.aging_per_s = aging_per_s
        self._classes: dict[str, _Class[W]] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def queued(self, klass: str) -> int:
        entry = self._classes.get(klass)
        return entry.size if entry is not None else 0

    def sizes(self) -> dict[str, int]:
        return {name: entry.size for name, entry in self._classes.items()}

    def oldest(self, klass: str | None = None) -> float | None:
        """When the longest-queued request still here (of `klass`, or of any class) was enqueued (None: none)."""
        entries = self._classes.values() if klass is None else [e for e in (self._classes.get(klass),) if e]
        found = [w.enqueued for entry in entries if entry.size and (w := entry.oldest()) is not None]
        return min(found) if found else None

    def push(self, waiter: W) -> None:
        entry = self._classes.get(waiter.klass)
        if entry is None:
            entry = self._classes[waiter.klass] = _Class[W](waiter.klass, waiter.priority)
        waiters = entry.tenants.get(waiter.tenant)
        if waiters is None:
            waiters = entry.tenants[waiter.tenant] = deque()
        if not waiters:
            # Joining the backlog: start level with the least-served backlogged tenant.
            active = [entry.counters.get(t, 0.0) for t, q in entry.tenants.items() if q and t != waiter.tenant]
            own = entry.counters.get(waiter.tenant, 0.0)
            entry.counters[waiter.tenant] = max(own, min(active)) if active else own
        waiters.append(waiter)
        entry.size += 1
        self._size += 1

    def ranked(self, now: float, priorities: Mapping[str, int] | None = None) -> list[str]:
        """Classes with queued requests, in the order they are served: effective priority (priority +
        aging of their oldest request), ties to the older oldest request. `priorities` replaces the classes'
        own (those it names): classes given the same one are served in arrival order."""
        ranks: list[tuple[float, float, str]] = []
        for entry in self._classes.values():
            oldest = entry.oldest()
            if oldest is not None:
                priority = entry.priority if priorities is None else priorities.get(entry.name, entry.priority)
                waited = max(0.0, now - oldest.enqueued)
                ranks.append((-(priority + self.aging_per_s * waited), oldest.enqueued, entry.name))
        return [name for _, _, name in sorted(ranks)]

    def pop(self, now: float) -> W | None:
        """The next request to dispatch, or None when the queue is empty."""
        ranked = self.ranked(now)
        return self.pop_class(ranked[0]) if ranked else None

    def pop_class(self, klass: str, oldest: bool = False) -> W | None:
        """The next request of `klass`: its least-served backlogged tenant's oldest (with `oldest`: the class's
        oldest, whatever its tenant; the counters still count it)."""
        chosen = self._classes.get(klass)
        if chosen is None or not chosen.size:
            return None
        if oldest:
            tenant = min(chosen.tenants, key=lambda t: chosen.tenants[t][0].enqueued)
        else:
            tenant = min(chosen.tenants, key=lambda t: (chosen.counters.get(t, 0.0), chosen.tenants[t][0].enqueued))
        waiter = chosen.tenants[tenant].popleft()
        chosen.counters[tenant] = chosen.counters.get(tenant, 0.0) + waiter.tokens / waiter.weight
        self._forget(chosen, tenant, waiter)
        return waiter

    def remove(self, waiter: W) -> bool:
        """Take `waiter` out (its client left, or it expired); False if it was no longer queued."""
        if not waiter.queued:
            return False
        entry = self._classes[waiter.klass]
        entry.tenants[waiter.tenant].remove(waiter)
        self._forget(entry, waiter.tenant, waiter)
        return True

    def lowest(self) -> W | None:
        """The request to displace first: the newest of the lowest class (its heaviest tenant's)."""
        candidates = [e for e in self._classes.values() if e.size]
        if not candidates:
            return None
        entry = min(candidates, key=lambda e: e.priority)
        tenant = max((t for t, q in entry.tenants.items() if q), key=lambda t: (entry.counters.get(t, 0.0), len(
            entry.tenants[t])))
        return entry.tenants[tenant][-1]

    def _forget(self, entry: _Class[W], tenant: str, waiter: W) -> None:
        waiter.queued = False
        entry.size -= 1
        self._size -= 1
        if not entry.tenants[tenant]:
            del entry.tenants[tenant]
        if entry.size == 0:
            entry.counters.clear()  # nobody backlogged: no history to keep
        elif len(entry.counters) > _MAX_COUNTERS:  # many tenants came and went during one long backlog
            entry.counters = {t: c for t, c in entry.counters.items() if t in entry.tenants}
