"""Pick the endpoint with the fewest in-flight requests from this process; ties rotate."""

from __future__ import annotations

from extproc.endpoints import Endpoint, PoolState


class LeastInFlightPicker:
    """Primary = fewest in flight; fallbacks = the next ones in the same order."""

    def __init__(self) -> None:
        self._rotation = 0

    def pick(self, pool: PoolState, fallbacks: int) -> tuple[Endpoint, ...]:
        endpoints = pool.endpoints
        count = len(endpoints)
        if count == 0:
            return ()
        self._rotation = (self._rotation + 1) % count
        start = self._rotation
        ranked = sorted(range(count), key=lambda i: (endpoints[i].in_flight, (i - start) % count))
        return tuple(endpoints[i] for i in ranked[: 1 + fallbacks])
