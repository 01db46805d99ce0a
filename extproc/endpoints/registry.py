"""Live per-endpoint state of every pool: what this process has in flight on each endpoint.

Config says which endpoints exist; this registry keeps the counters that outlive a config reload
(an endpoint kept across a reload keeps its in-flight count, so leases still balance).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(slots=True, eq=False)
class Endpoint:
    address: str
    in_flight: int = 0
    picked_total: int = 0


@dataclass(slots=True)
class PoolState:
    name: str
    endpoints: list[Endpoint] = field(default_factory=list)


class Lease:
    """One request's claim on an endpoint; releasing it twice is harmless."""

    __slots__ = ("_released", "endpoint")

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._released = False
        endpoint.in_flight += 1
        endpoint.picked_total += 1

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.endpoint.in_flight -= 1


class EndpointRegistry:
    def __init__(self) -> None:
        self._pools: dict[str, PoolState] = {}

    def sync(self, pools: Iterable[tuple[str, Iterable[str]]]) -> None:
        """Make the registry match `(pool name, endpoint addresses)`, keeping known endpoints' state."""
        known = {ep.address: ep for state in self._pools.values() for ep in state.endpoints}
        fresh: dict[str, PoolState] = {}
        for name, addresses in pools:
            fresh[name] = PoolState(name, [known.get(a) or Endpoint(a) for a in addresses])
        self._pools = fresh

    def pool(self, name: str) -> PoolState | None:
        return self._pools.get(name)

    def pools(self) -> list[PoolState]:
        return list(self._pools.values())

    def total_in_flight(self) -> int:
        return sum(ep.in_flight for state in self._pools.values() for ep in state.endpoints)
