"""Stage 4, flow control: go now, wait in the pool's admission queue, or be shed (extproc/flow), with room taken
from the pool's load model (extproc/endpoints/load.py) over its usable endpoints."""

from __future__ import annotations

import math
from collections.abc import Callable

from extproc.endpoints.health import HealthTracker
from extproc.flow import GO, FlowController, Rejected, Room, Ticket
from extproc.gateway.priority import overloaded
from extproc.gateway.records import Caller, Resolved
from extproc.gateway.runtime import Runtime
from extproc.openai import ApiError
from extproc.telemetry import GatewayMetrics

__all__ = ["Gate", "pool_room"]


def pool_room(runtime: Callable[[], Runtime], health: HealthTracker
              ) -> Callable[[str, float, float, float], Room]:
    """Flow control's room callback: how many more requests of a class keeping `reserve` free a pool's usable
    endpoints take (counted up to `enough`), under the current runtime."""

    def room(pool_name: str, now: float, reserve: float, enough: float) -> Room:
        pool = runtime().pools.get(pool_name)
        if pool is None:
            return Room(math.inf, 0)
        load = pool.load
        return Room.of((load.room(e, now, reserve) for e in health.each_usable(pool.endpoints, now)), enough)

    return room


class Gate:
    def __init__(self, flow: FlowController, metrics: GatewayMetrics) -> None:
        self.flow = flow
        self._metrics = metrics

    def offer(self, caller: Caller, resolved: Resolved) -> Ticket | None:
        """None: go now. A ticket: wait for room (the server awaits it, then calls `granted`). Raises the 503
        (or the class's status) when the request is shed."""
        if not caller.klass:
            return None
        pool = resolved.pool.name
        verdict = self.flow.offer(pool, caller.tenant.name, caller.klass, resolved.tokens, caller.tier.weight)
        if verdict == GO:
            return None
        if isinstance(verdict, Rejected):
            raise self._shed(pool, verdict)
        assert isinstance(verdict, Ticket)
        return verdict

    def granted(self, resolved: Resolved, outcome: Rejected | None) -> None:
        """The ticket's outcome: nothing to do when granted, else raises the refusal."""
        if outcome is not None:
            raise self._shed(resolved.pool.name, outcome)

    def _shed(self, pool: str, rejected: Rejected) -> ApiError:
        self._metrics.flow_rejected.labels(pool, rejected.klass, rejected.reason).inc()
        return overloaded(rejected)
