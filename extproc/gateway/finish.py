"""Stage 6, the end of an exchange (normal end, client gone, reset): give back once whatever its records hold,
and count it. Separately, `Outcomes`: what the access log later says about the endpoint that served it."""

from __future__ import annotations

from collections.abc import Callable

from extproc.endpoints.health import HealthTracker
from extproc.flow import FlowController
from extproc.gateway.records import Exchange
from extproc.gateway.runtime import Runtime
from extproc.gateway.tenant_gate import TenantGate
from extproc.limits.types import Reservation
from extproc.telemetry import GatewayMetrics

__all__ = ["Finish", "Outcomes"]


class Finish:
    def __init__(self, tenants: TenantGate, flow: FlowController, metrics: GatewayMetrics,
                 clock: Callable[[], float]) -> None:
        self._tenants = tenants
        self._flow = flow
        self._metrics = metrics
        self._clock = clock

    def __call__(self, exchange: Exchange) -> Reservation | None:
        """Release everything once; returns the reservation whose concurrency leases the server must release
        in the store (and settle at 0 when the request never reached a model)."""
        if exchange.finished:
            return None
        exchange.finished = True
        caller, admitted, routed = exchange.caller, exchange.admitted, exchange.routed
        if exchange.parse_reserved and caller is not None:  # no decision on its body came (client gone, too large)
            self._tenants.refund(caller.tenant, exchange.parse_reserved, caller.runtime.policy.bounds, self._clock())
            exchange.parse_reserved = 0.0
        if admitted is not None and admitted.holds_slot and caller is not None:
            self._tenants.drop(caller.tenant)
        if exchange.ticket is not None:
            self._flow.leave(exchange.ticket)
        metrics = self._metrics
        pool = "none"
        if routed is not None:
            pool = routed.pool
            for lease in routed.leases:
                lease.release()
            self._flow.finished(pool)
            metrics.in_flight.dec()
            metrics.duration_seconds.labels(pool).observe(self._clock() - routed.at)
        elif exchange.resolved is not None:
            pool = exchange.resolved.pool.name
        resolved = exchange.resolved
        model = resolved.request.model if resolved is not None else "unknown"
        if caller is None or model not in caller.runtime.by_model:
            model = "unknown"
        metrics.requests.labels(model, pool, exchange.outcome).inc()
        return admitted.reservation if admitted is not None else None


class Outcomes:
    """A finished exchange's outcome on the endpoint that served it, from Envoy's access log: feeds the circuit
    breakers and the endpoint's latency (time to the response headers)."""

    def __init__(self, runtime: Callable[[], Runtime], health: HealthTracker, metrics: GatewayMetrics,
                 clock: Callable[[], float]) -> None:
        self._runtime = runtime
        self._health = health
        self._metrics = metrics
        self._clock = clock

    def __call__(self, address: str, pool_name: str | None, ok: bool, latency_s: float | None = None) -> None:
        pool = self._runtime().pools.get(pool_name) if pool_name else None
        members = pool.endpoints if pool is not None else ()
        if self._health.record(address, ok, self._clock(), members):
            self._metrics.ejections.labels(pool_name or "none").inc()
        if ok and latency_s is not None:
            endpoint = next((e for e in members if e.address == address), None)
            if endpoint is not None:
                endpoint.served(latency_s)
