"""Stage 4, flow control: go now, wait in the pool's admission queue, or be shed (extproc/flow), with room taken
from the pool's load model (extproc/endpoints/load.py) over its usable endpoints."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

from extproc.endpoints.adapters import AdapterManager
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
        usable = health.each_usable(pool.endpoints, now)
        cold_s = pool.config.cold_start_timeout_s
        if cold_s > 0:  # a pool that may be at zero ready endpoints: hold for the first one
            ready = (e for e in usable if pool.is_ready(e))
            first = next(ready, None)
            if first is None:
                return Room(0.0, 0, cold_s)
            usable = itertools.chain((first,), ready)
        load = pool.load
        return Room.of((load.room(e, now, reserve) for e in usable), enough)

    return room


class Gate:
    def __init__(self, flow: FlowController, metrics: GatewayMetrics, health: HealthTracker | None = None) -> None:
        self.flow = flow
        self._metrics = metrics
        self._health = health
        self.adapters: AdapterManager | None = None  # set by the server (it does the I/O of loading adapters)

    def adapter(self, caller: Caller, resolved: Resolved, now: float) -> Ticket | None:
        """For an adapter the pool loads on demand (`lora_paths`) that no ready endpoint has: a ticket released
        once it is loaded. Raises the 503 when it cannot be waited for."""
        name = resolved.request.model
        config = resolved.pool
        if self.adapters is None or self._health is None or name not in config.lora_paths:
            return None
        pool = caller.runtime.pools[config.name]
        holders = [e for e in pool.ready(self._health.usable(pool.endpoints, now)) if name in e.adapters]
        if holders:
            self.adapters.touch(holders, name)
            return None
        verdict = self.adapters.wait(config.name, name, caller.tenant.name, caller.klass, resolved.tokens)
        if isinstance(verdict, Rejected):
            raise self._shed(config.name, verdict)
        return verdict

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
