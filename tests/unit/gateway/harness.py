"""The gateway as the stream processor drives it, synchronously: the headers, the body phase up to what it waits
for (the limits store, room in the pool) or its decision, and the answers the server would have awaited."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry

from extproc.config import parse_policy
from extproc.flow import Rejected
from extproc.gateway import (
    BodyPhase,
    Decision,
    Exchange,
    Pool,
    RequestHead,
    Respond,
    RuntimeHolder,
    Wait,
    build_gateway,
)
from extproc.gateway.auth import Authenticator
from extproc.limits.types import AdmitResult
from extproc.telemetry import GatewayMetrics
from extproc.tenants import Tenant


class Harness:
    def __init__(self, policy: str, *, clock: Callable[[], float] = lambda: 0.0,
                 cpu_clock: Callable[[], float] = lambda: 0.0, authenticator: Authenticator | None = None,
                 replica_id: str | None = None) -> None:
        self.runtimes = RuntimeHolder(parse_policy(policy))
        self.metrics = GatewayMetrics(CollectorRegistry())
        self.parts = build_gateway(self.runtimes, self.metrics, authenticator=authenticator, clock=clock,
                                   cpu_clock=cpu_clock, replica_id=replica_id)
        self.gateway = self.parts.gateway
        self._phases: dict[Exchange, BodyPhase] = {}

    def headers(self, head: RequestHead, tenant: Tenant | None = None) -> tuple[Exchange, Respond | None]:
        return self.gateway.headers(head, tenant)

    def body(self, exchange: Exchange, body: bytes) -> Decision | Wait:
        self._phases[exchange] = self.gateway.body(exchange, body)
        return self.send(exchange, None)

    def send(self, exchange: Exchange, answer: AdmitResult | Rejected | None) -> Decision | Wait:
        """The answer to what the body phase waited for: its next wait, or its decision."""
        try:
            return self._phases[exchange].send(answer)
        except StopIteration as done:
            del self._phases[exchange]
            return done.value  # type: ignore[no-any-return]

    def finish(self, exchange: Exchange) -> object:
        return self.gateway.finish(exchange)

    def pool(self, name: str) -> Pool:
        return self.runtimes.current.pools[name]

    def in_flight(self) -> int:
        return sum(e.in_flight for e in self.runtimes.registry.endpoints())
