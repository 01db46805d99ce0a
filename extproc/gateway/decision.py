"""A request's decision, read top to bottom: authenticate -> resolve -> admit -> gate -> schedule; finish at the end.

Sans-IO: the body phase is a generator. Where the decision needs the outside world it yields what to wait for
(an `AdmitRequest`: the server asks the limits store; a `Ticket`: the server waits for room in the pool) and is
sent the answer; it returns the `Decision` for Envoy. The server adapter only translates protobufs, awaits what
is yielded, and keeps the `Exchange` (the stages' records) until the stream ends.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from extproc.flow import Rejected, Ticket
from extproc.gateway.admission import Admit
from extproc.gateway.authenticate import Authenticate
from extproc.gateway.finish import Finish, Outcomes
from extproc.gateway.gate import Gate
from extproc.gateway.records import Exchange, RequestIds, Resolved, error_response, refusal
from extproc.gateway.resolve import Resolve
from extproc.gateway.runtime import RuntimeHolder
from extproc.gateway.schedule import Schedule
from extproc.gateway.tenant_gate import TenantGate
from extproc.gateway.types import Decision, RequestHead, Respond
from extproc.limits.types import AdmitRequest, AdmitResult, Reservation
from extproc.openai import ApiError, api_for_path
from extproc.openai import errors as oai
from extproc.scheduling import Explanation
from extproc.telemetry import GatewayMetrics
from extproc.tenants import Tenant

__all__ = ["BodyPhase", "Gateway", "Stages", "Wait"]

Wait = AdmitRequest | Ticket  # what the body phase yields for the server to await
BodyPhase = Generator[Wait, AdmitResult | Rejected | None, Decision]


@dataclass(frozen=True)
class Stages:
    authenticate: Authenticate
    resolve: Resolve
    admit: Admit
    gate: Gate
    schedule: Schedule
    finish: Finish


class Gateway:
    def __init__(self, runtimes: RuntimeHolder, stages: Stages, tenants: TenantGate, metrics: GatewayMetrics,
                 clock: Callable[[], float], cpu_clock: Callable[[], float], request_ids: RequestIds,
                 outcomes: Outcomes | None = None) -> None:
        self.runtimes = runtimes
        self._outcomes = outcomes
        self.stages = stages
        self.request_ids = request_ids
        self._tenants = tenants
        self._metrics = metrics
        self._clock = clock
        self._cpu_clock = cpu_clock  # CPU time of the event loop's thread: what a decision really costs

    def headers(self, head: RequestHead, tenant: Tenant | None = None,
                reserve: bool = True) -> tuple[Exchange, Respond | None]:
        """The exchange, and the answer if the headers alone decide it (`tenant`: explain's, see there). The body
        to come is charged to the tenant's parse budget now (`reserve`: not for explain, which spends nothing)."""
        exchange = Exchange(self._clock(), self.request_ids())
        try:
            caller = self.stages.authenticate(self.runtimes.current, head, exchange.request_id, tenant)
        except ApiError as error:
            return exchange, refusal(exchange, error, api_for_path(head.path))
        if isinstance(caller, Respond):
            exchange.outcome = "models"
            return exchange, caller
        exchange.caller = caller
        if reserve:
            exchange.parse_reserved = self._tenants.reserve(caller.tenant, head.headers.get("content-length", ""),
                                                            caller.runtime.policy.bounds, self._clock())
        return exchange, None

    def body(self, exchange: Exchange, body: bytes) -> BodyPhase:
        """The rest of the decision; see the module's docstring for what it yields."""
        stages = self.stages
        caller = exchange.caller
        if caller is None:  # refused at the headers (Envoy sends no body then) or a body before headers
            return refusal(exchange, oai.bad_request("body before headers"))
        try:
            exchange.resolved = resolved = self._resolve(exchange, body)
            ask = stages.admit.ask(caller, resolved)
            if ask is not None:
                result = yield ask
                assert isinstance(result, AdmitResult)
                exchange.admitted = stages.admit.decide(caller, ask, result)
            loading = stages.gate.adapter(caller, resolved, self._clock())
            if loading is not None:  # its LoRA adapter is loaded on demand: wait for it first
                outcome = yield loading
                assert outcome is None or isinstance(outcome, Rejected)
                stages.gate.granted(caller, resolved, outcome)
            ticket = exchange.ticket = stages.gate.offer(caller, resolved)
            if ticket is not None:
                outcome = yield ticket
                assert outcome is None or isinstance(outcome, Rejected)
                stages.gate.granted(caller, resolved, outcome)
            try:
                exchange.routed = routed = stages.schedule(caller, resolved, exchange.admitted,
                                                           record=exchange.scores)
            finally:
                if ticket is not None:
                    stages.gate.flow.routed(ticket)
        except ApiError as error:
            return refusal(exchange, error)
        exchange.outcome = "routed"
        return routed.route

    def refuse(self, exchange: Exchange, error: ApiError) -> Respond:
        """The exchange ends with `error` before its decision (e.g. a streamed body grew past the limit)."""
        return refusal(exchange, error)

    def _resolve(self, exchange: Exchange, body: bytes) -> Resolved:
        """Resolve, charging the time the decision held the loop to the tenant's parse budget (wall clock, never
        less than its CPU time: the time every other stream of this process waited; see tenant_gate.py)."""
        assert exchange.caller is not None
        caller = exchange.caller
        started, cpu_started = self._clock(), self._cpu_clock()
        bounds = caller.runtime.policy.bounds
        try:
            # Its own reservation is no reason to refuse it; the others' and their decisions since may be.
            self._tenants.refund(caller.tenant, exchange.parse_reserved, bounds, started)
            exchange.parse_reserved = 0.0
            self.stages.authenticate.refuse_early(caller.tenant, caller.runtime)  # its budget may be spent since
            return self.stages.resolve(caller, body, cpu_started)
        finally:
            now = self._clock()
            self._metrics.decision_seconds.observe(now - started)
            spent = max(now - started, self._cpu_clock() - cpu_started)
            # The anonymous tenant (auth none) has no parse budget: its bodies only teach the cost per byte.
            self._tenants.charge(caller.tenant, spent, bounds, now, len(body))

    def response_headers(self, exchange: Exchange, status: int,
                         served: str | None = None) -> tuple[tuple[str, str], ...]:
        """Record the status; returns headers to add to the response: the rate-limit headers fixed at admission.
        Only endpoint-picker mode sends us response headers: a rendered Envoy adds those headers from our dynamic
        metadata itself. `served`: the endpoint the data plane reports it sent the request to (endpoint-picker
        mode, when no access log reports it)."""
        exchange.status = status
        if served is not None:
            self._served(exchange, status, served)
        admitted = exchange.admitted
        return admitted.headers if admitted is not None else ()

    def _served(self, exchange: Exchange, status: int, served: str) -> None:
        """Passive health and in-flight accounting from the response: a retry to a fallback moves the request's
        lease to the endpoint that really serves it."""
        routed, caller = exchange.routed, exchange.caller
        if routed is None or caller is None:
            return
        policy = caller.runtime.policy
        if policy.mode != "endpoint-picker" or policy.endpoint_picker.outcomes != "response":
            return
        address = served.partition(",")[0].strip()
        pool = caller.runtime.pools.get(routed.pool)
        if pool is None:
            return
        lease = routed.leases[0] if routed.leases else None
        if lease is not None and lease.endpoint.address != address:
            endpoint = next((e for e in pool.endpoints if e.address == address), None)
            if endpoint is not None:
                lease.release()
                exchange.routed = dataclasses.replace(routed, leases=(endpoint.lease(lease.tokens),))
        latency_s = self._clock() - routed.at
        self._metrics.upstream_status.labels(routed.pool, f"{status // 100}xx").inc()
        self._metrics.ttfb_seconds.labels(routed.pool).observe(latency_s)
        if self._outcomes is not None:
            self._outcomes(address, routed.pool, 0 < status < 500, latency_s)

    def failed(self, exchange: Exchange) -> None:
        """Our own error ended the exchange (a 500): it reached no model, so it is charged nothing."""
        exchange.outcome = "internal_error"
        exchange.status = 500

    def finish(self, exchange: Exchange) -> Reservation | None:
        return self.stages.finish(exchange)

    def explain(self, head: RequestHead, body: bytes, tenant: Tenant | None = None) -> dict[str, Any]:
        """The decision this request would get now, with every endpoint's scores; nothing is sent or kept.
        `tenant`: decide as that tenant (no key is checked: explain must not tell valid keys from others)."""
        exchange, early = self.headers(head, tenant, reserve=False)
        explanation = Explanation()
        decision: Decision
        if early is not None or exchange.caller is None:
            decision = early or error_response(oai.bad_request("no request"))
        else:
            try:
                exchange.resolved = self.stages.resolve(exchange.caller, body, self._cpu_clock(), counting=False)
                decision = self.stages.schedule(exchange.caller, exchange.resolved, None, explanation).route
            except ApiError as error:
                decision = error_response(error, api=exchange.caller.api)
        resolved = exchange.resolved
        runtime = exchange.runtime or self.runtimes.current
        result: dict[str, Any] = {"config_version": runtime.version,
                                  "model": resolved.request.model if resolved is not None else None,
                                  "pool": resolved.pool.name if resolved is not None else None}
        if isinstance(decision, Respond):
            result.update(decision="respond", status=decision.status, body=json.loads(decision.body or b"null"))
        else:
            result.update(decision="route", pool=decision.pool, profile=runtime.pools[decision.pool].config.profile,
                          endpoints=list(decision.endpoints), set_headers=dict(decision.set_headers),
                          body_rewritten=decision.body is not None, filtered_out=explanation.filtered_out,
                          scores=explanation.scores, totals=explanation.totals)
        return result
