"""The decision pipeline: request head -> body -> Decision, and the outcome bookkeeping after.

Sans-IO and synchronous: the server adapter feeds it plain dataclasses and turns its answers into
protobufs. Per-request routing state lives in an `Exchange`, apart from protocol state.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import Any

from extproc.config import PoolConfig
from extproc.endpoints import Endpoint, EndpointRegistry, Lease
from extproc.endpoints.health import HealthConfig, HealthTracker
from extproc.flow import GO, FlowController, Rejected, Room, Ticket
from extproc.gateway.admission import (
    Admission,
    admit_request,
    has_budgets,
    has_limits,
    rate_limited,
    ratelimit_headers,
    refused_dimension,
)
from extproc.gateway.auth import Authenticator
from extproc.gateway.calibration import PromptCalibration
from extproc.gateway.exchange import (
    JSON_HEADERS,
    Exchange,
    Queued,
    RequestIds,
    error_response,
    route_metadata,
    who,
)
from extproc.gateway.priority import overloaded, priority_class
from extproc.gateway.snapshot import SnapshotHolder
from extproc.gateway.tenant_gate import TenantGate
from extproc.gateway.types import Decision, RequestHead, Respond, Route
from extproc.limits.types import AdmitResult, Reservation
from extproc.openai import (
    ApiError,
    InferenceRequest,
    api_for_path,
    cap_output_tokens,
    decode_json,
    parse_document,
    requested_model,
    rewrite_body,
)
from extproc.openai import errors as oai
from extproc.openai.tokens import estimate_chars
from extproc.rollout.config import SplitConfig
from extproc.rollout.controller import Rollouts
from extproc.rollout.split import select_pool
from extproc.scheduling import Explanation, Scheduler, SchedulingRequest, prefix_blocks
from extproc.telemetry import GatewayMetrics
from extproc.tenants import ANONYMOUS, Tenant

_LATENCY_EWMA_ALPHA = 0.2


class Gateway:
    def __init__(
        self,
        snapshots: SnapshotHolder,
        registry: EndpointRegistry,
        metrics: GatewayMetrics,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        authenticator: Authenticator | None = None,
        rollouts: Rollouts | None = None,
        replica_id: str | None = None,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self.rollouts = rollouts
        self.request_ids = RequestIds(replica_id)
        self._cpu_clock = cpu_clock  # CPU time of the event loop's thread: what a decision really costs
        self.tenants = TenantGate()
        self.calibration = PromptCalibration()
        self.discovered: dict[str, tuple[str, ...]] = {}  # pool -> addresses from DNS discovery
        self._snapshots = snapshots
        self._wall_clock = wall_clock
        self.authenticator = authenticator or Authenticator()
        self.health = HealthTracker(HealthConfig(**snapshots.current.policy.health.model_dump()))
        self._registry = registry
        self._metrics = metrics
        self._clock = clock
        self._sequence = 0
        self._scheduler_version = snapshots.current.version
        policy = snapshots.current.policy
        self.scheduler = Scheduler(policy.scheduling, unshared_replicas=policy.unshared_replicas())
        self._plugin_timers = {
            name: metrics.plugin_seconds.labels(name).observe
            for profile in self.scheduler.profiles.values()
            for name in (*(f.name for f in profile.filters), *(w.scorer.name for w in profile.scorers),
                         profile.picker.name)
        }
        self.flow = FlowController(snapshots.current.policy.flow_control, self.pool_room, clock,
                                   lambda klass, seconds: metrics.flow_wait_seconds.labels(klass).observe(seconds))
        self.sync_endpoints()

    def pool_room(self, pool_name: str, now: float, reserve: float = 0.0) -> Room:
        """How many more requests of a class keeping `reserve` free `pool_name`'s usable endpoints take."""
        snapshot = self._snapshots.current
        pool = snapshot.by_name.get(pool_name)
        if pool is None:
            return Room(math.inf, 0)
        load = snapshot.load[pool_name]
        return Room.of(load.room(e, now, reserve) for e in self._usable(pool, now))

    def _with_room(self, exchange: Exchange, candidates: list[Endpoint], now: float) -> list[Endpoint]:
        """The candidates with room for the request's class (all of them if none has room)."""
        spec = exchange.snapshot.policy.flow_control.classes.get(exchange.klass)
        if spec is None:
            return candidates
        load = exchange.snapshot.load[exchange.pool]
        kept = [e for e in candidates if (room := load.room(e, now, spec.reserve)) is None or room > 0]
        return kept or candidates

    def sync_endpoints(self) -> None:
        pools = self._snapshots.current.policy.pools
        self._registry.sync((pool.name, self.discovered.get(pool.name, pool.endpoints)) for pool in pools)

    def discovered_endpoints(self, pool: str, addresses: tuple[str, ...]) -> None:
        """DNS discovery found a new address set for `pool` (endpoints it keeps keep their state)."""
        self.discovered[pool] = addresses
        self.sync_endpoints()

    def reload(self) -> None:
        """Adopt the holder's current snapshot: endpoints, scheduler (plugin state restarts), health."""
        snapshot = self._snapshots.current
        if snapshot.version == self._scheduler_version:
            return
        self.scheduler = Scheduler(snapshot.policy.scheduling, unshared_replicas=snapshot.policy.unshared_replicas())
        self._scheduler_version = snapshot.version
        for profile in self.scheduler.profiles.values():
            for name in (*(f.name for f in profile.filters), *(w.scorer.name for w in profile.scorers),
                         profile.picker.name):
                self._plugin_timers.setdefault(name, self._metrics.plugin_seconds.labels(name).observe)
        self.health.config = HealthConfig(**snapshot.policy.health.model_dump())
        self.flow.configure(snapshot.policy.flow_control)
        self.sync_endpoints()

    def _time_plugin(self, name: str, seconds: float) -> None:
        observe = self._plugin_timers.get(name)
        if observe is not None:
            observe(seconds)

    def scheduling_request(self, exchange: Exchange, request: InferenceRequest, sequence: int = 0,
                           pool: PoolConfig | None = None) -> SchedulingRequest:
        pool = pool or exchange.snapshot.by_name[exchange.pool]
        profile = self.scheduler.profile(pool.profile)
        head = exchange.head
        return SchedulingRequest(
            model=request.model,
            prompt_tokens=self._prompt_tokens(exchange, request, pool.name),
            max_output_tokens=request.output_tokens,
            prefix_blocks=prefix_blocks(request.prompt_text) if profile.needs_prefix else (),
            lora=request.model if request.model in pool.lora_adapters else None,
            session=head.headers.get("x-session-id") or request.user,
            now=self._clock(),
            load=exchange.snapshot.load[pool.name],
            sequence=sequence,
        )

    # -- request phases -------------------------------------------------------------------------
    def request_headers(self, head: RequestHead, tenant: Tenant | None = None) -> tuple[Exchange, Respond | None]:
        """The exchange, and the answer if the headers alone decide it. `tenant` (explain only): decide as
        this tenant instead of authenticating the request."""
        snapshot = self._snapshots.current
        if snapshot.version != self._scheduler_version:
            self.reload()
        path = head.path.partition("?")[0]
        exchange = Exchange(head, snapshot, api_for_path(path), self._clock())
        exchange.request_id = self.request_ids()
        models = exchange.api is None and path.rstrip("/") == "/v1/models" and head.method == "GET"
        if exchange.api is None and not models:
            return exchange, self._reject(exchange, oai.not_found(path))
        if not models and head.method != "POST":
            return exchange, self._reject(exchange, oai.method_not_allowed(head.method, path))
        if not models and head.end_of_stream:
            return exchange, self._reject(exchange, oai.bad_request("Request body is empty", "invalid_json"))
        policy = snapshot.policy
        try:
            exchange.tenant = tenant or self.authenticator.authenticate(head, policy.auth, set(policy.tiers))
        except ApiError as error:
            return exchange, self._reject(exchange, error)
        if models:  # what this tenant may use, and only to an authenticated caller
            exchange.outcome = "models"
            return exchange, Respond(200, snapshot.models_for(exchange.tenant.models), JSON_HEADERS, details="models")
        limit = policy.bounds.max_body_bytes
        declared = head.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            return exchange, self._reject(exchange, oai.too_large(limit))
        tier = policy.tiers[exchange.tenant.tier]
        limits = exchange.tenant.limits or tier.limits
        model_limits = exchange.tenant.model_limits or tier.model_limits
        exchange.limited = has_limits(limits) or has_limits(model_limits)
        exchange.budgeted = has_budgets(limits) or has_budgets(model_limits)
        refusal = self._early_refusal(exchange)
        if refusal is not None:
            return exchange, refusal
        if policy.flow_control.enabled:
            try:
                exchange.klass = priority_class(head, tier, policy.flow_control)
            except ApiError as error:
                return exchange, self._reject(exchange, error)
        return exchange, None

    def _early_refusal(self, exchange: Exchange) -> Respond | None:
        """Refused before the body is parsed (TenantGate: local concurrency, rate retry, parse budget)."""
        policy = exchange.snapshot.policy
        limits = exchange.tenant.limits or policy.tiers[exchange.tenant.tier].limits
        refused = self.tenants.refusal(exchange.tenant, limits, policy.bounds, self._clock())
        if refused is None:
            return None
        self._metrics.rate_limited.labels(refused[0]).inc()
        return self._reject(exchange, refused[1])

    def request_body(self, exchange: Exchange, body: bytes) -> Decision | Admission | Queued:
        """Route, or ask for admission first (the server awaits the store, then calls `admitted`), or
        queue while the pool is saturated (the server awaits the ticket, then calls `dequeued`)."""
        started = self._clock()
        exchange.cpu_started = self._cpu_clock()
        policy = exchange.snapshot.policy
        try:
            if exchange.api is not None and exchange.request is None:
                refusal = self._early_refusal(exchange)  # e.g. its parse budget ran out since its headers
                if refusal is not None:
                    return refusal
            request, pool = self._resolve(exchange, body)
            output = request.output_tokens
            tokens = self._prompt_tokens(exchange, request, pool.name) + (
                output if output is not None else policy.limits.default_output_tokens * request.sequences)
            exchange.tokens = tokens
            admission = admit_request(exchange.tenant, policy.tiers[exchange.tenant.tier], pool.model,
                                      exchange.request_id, self._wall_clock(), tokens, policy.limits)
            if admission is not None:
                exchange.admission = admission
                exchange.body = body
                return Admission(admission)
            return self._gate(exchange, body)
        except ApiError as error:
            return self._reject(exchange, error)
        finally:
            self._metrics.decision_seconds.observe(self._clock() - started)
            if exchange.tenant is not ANONYMOUS:  # the anonymous tenant (auth none) has no parse budget
                self.tenants.charge(exchange.tenant, self._cpu_clock() - exchange.cpu_started, policy.bounds,
                                    self._clock())

    def admitted(self, exchange: Exchange, result: AdmitResult) -> Decision | Queued:
        """Continue after the store answered an Admission."""
        exchange.limit_states = result.states
        if not result.admitted or exchange.admission is None:
            self._metrics.rate_limited.labels(refused_dimension(result.refused_by)).inc()
            self.tenants.store_refused(exchange.tenant, result.refused_by, result.retry_after_s, self._clock())
            return self._reject(exchange, rate_limited(result.refused_by, result.retry_after_s, result.states))
        exchange.reservation = Reservation.of(exchange.admission)
        exchange.holds_slot = self.tenants.admitted(exchange.tenant, exchange.admission.concurrency)
        try:
            return self._gate(exchange, exchange.body)
        except ApiError as error:
            return self._reject(exchange, error)

    def _gate(self, exchange: Exchange, body: bytes) -> Decision | Queued:
        """Flow control: route now, queue while the pool is saturated, or shed."""
        if not exchange.klass:
            return self._route_once(exchange, body)
        weight = exchange.snapshot.policy.tiers[exchange.tenant.tier].weight
        verdict = self.flow.offer(exchange.pool, exchange.tenant.name, exchange.klass, exchange.tokens, weight)
        if verdict == GO:
            return self._route_once(exchange, body)
        if isinstance(verdict, Rejected):
            return self._shed(exchange, verdict)
        assert isinstance(verdict, Ticket)
        exchange.ticket = verdict
        exchange.body = body
        return Queued(verdict)

    def dequeued(self, exchange: Exchange, outcome: Rejected | None) -> Decision:
        """Continue after a queued request was granted room (`outcome` None) or timed out."""
        if outcome is not None:
            return self._shed(exchange, outcome)
        try:
            return self._route_once(exchange, exchange.body)
        except ApiError as error:
            return self._reject(exchange, error)
        finally:
            if exchange.ticket is not None:
                self.flow.routed(exchange.ticket)

    def _route_once(self, exchange: Exchange, body: bytes) -> Decision:
        try:
            return self._route(exchange, body)
        finally:
            exchange.body = b""

    def _shed(self, exchange: Exchange, rejected: Rejected) -> Respond:
        self._metrics.flow_rejected.labels(exchange.pool, rejected.klass, rejected.reason).inc()
        return self._reject(exchange, overloaded(rejected))

    def _prompt_tokens(self, exchange: Exchange, request: InferenceRequest, pool: str) -> int:
        """The prompt's estimated tokens, calibrated against the pool's real counts when enabled."""
        if not exchange.prompt_estimate:
            exchange.prompt_estimate = estimate_chars(len(request.prompt_text) + request.extra_prompt_chars)
        if not exchange.snapshot.policy.limits.calibrate_prompt_tokens:
            return exchange.prompt_estimate
        return self.calibration.tokens(pool, exchange.prompt_estimate)

    def _count_guard(self, rule: str, action: str, matches: int) -> None:
        self._metrics.guard_matches.labels(rule, action).inc(matches)

    def _resolve(self, exchange: Exchange, body: bytes, counting: bool = True) -> tuple[InferenceRequest, PoolConfig]:
        if exchange.api is None:  # headers phase already answered; Envoy should not send a body
            raise oai.not_found(exchange.head.path)
        if exchange.request is not None and exchange.pool:
            return exchange.request, exchange.snapshot.by_name[exchange.pool]
        snapshot = exchange.snapshot
        document = decode_json(body, max_bytes=snapshot.body_limits.max_bytes)
        model = requested_model(document)
        user = document.get("user")
        # The model and the tenant's allow-list first: a refused request costs no more than its decoding.
        pool = self._pool_for(exchange, model, user if isinstance(user, str) else None)
        request = parse_document(exchange.api, document, snapshot.body_limits)
        self._within_cpu_budget(exchange)
        guard = snapshot.guard
        if guard is not None and guard.applies_to(exchange.tenant.tier):
            masked = guard.apply(request, self._count_guard if counting else None)
            if masked is not None:
                request, exchange.body_changed = masked, True
            self._within_cpu_budget(exchange)
        cap = snapshot.policy.tiers[exchange.tenant.tier].max_output_tokens
        if cap is None and exchange.budgeted and request.max_output_tokens is None:
            cap = snapshot.policy.limits.default_output_tokens  # the engine may not outrun the reservation
        capped = cap_output_tokens(request, cap) if cap is not None else None
        if capped is not None:
            request, exchange.body_changed = capped, True
        exchange.request = request
        exchange.model = request.model
        exchange.pool = pool.name
        return request, pool

    def _within_cpu_budget(self, exchange: Exchange) -> None:
        budget_ms = exchange.snapshot.policy.bounds.decision_cpu_ms
        if budget_ms and (self._cpu_clock() - exchange.cpu_started) * 1000 > budget_ms:
            raise oai.too_expensive(budget_ms)

    def _pool_for(self, exchange: Exchange, model: str, user: str | None) -> PoolConfig:
        """The pool serving `model` for this tenant (a split's weighted, sticky choice), or 404."""
        snapshot = exchange.snapshot
        split = snapshot.splits.get(model)
        if split is not None and exchange.tenant.may_use(model):
            return snapshot.by_name[self._split_pool(exchange, user, split)]
        found = snapshot.by_model.get(model)
        if found is None or not exchange.tenant.may_use(model):
            raise oai.model_not_found(model)
        return found

    def _split_pool(self, exchange: Exchange, user: str | None, split: SplitConfig) -> str:
        """Weighted, sticky choice among the split's pools (weights from the shared rollout state)."""
        weights = self.rollouts.current_weights(split.model) if self.rollouts is not None else None
        tenant = exchange.tenant
        return select_pool(split, weights, headers=exchange.head.headers, tier=tenant.tier,
                           tenant=None if tenant is ANONYMOUS else tenant.name,
                           session=exchange.head.headers.get("x-session-id"), user=user,
                           request_id=exchange.request_id).pool

    def _route(self, exchange: Exchange, body: bytes, explain: Explanation | None = None) -> Decision:
        """Decide; with `explain` the decision is only described: no lease, no learning, no counters."""
        request, pool = self._resolve(exchange, body, counting=explain is None)
        now = self._clock()
        candidates = self._usable(pool, now)
        if exchange.klass and len(candidates) > 1:
            candidates = self._with_room(exchange, candidates, now)
        if not candidates and pool.backup_pool is not None:
            # No healthy endpoint: the backup pool serves (the body names its model).
            backup = exchange.snapshot.by_name[pool.backup_pool]
            candidates = self._usable(backup, now)
            if candidates:
                pool = backup
                exchange.pool = backup.name
        sequence = self._sequence + 1
        scheduling = self.scheduling_request(exchange, request, sequence, pool)
        picked = self.scheduler.schedule(pool.profile, scheduling, candidates, 1 + pool.fallbacks,
                                          self._time_plugin, explain) if candidates else []
        if not picked:
            raise oai.no_capacity(pool.name)
        rewrite = request.model != pool.model and request.model not in pool.lora_adapters
        # Usage of streamed responses only comes with include_usage; Envoy copies it into metadata (to
        # settle a reservation, and for the audit log).
        want_usage = request.stream and not request.include_usage and (
            exchange.reservation is not None or bool(exchange.snapshot.policy.audit.path))
        new_body = rewrite_body(request.document, pool.model if rewrite else None, want_usage) if (
            rewrite or want_usage or exchange.body_changed) else None
        if explain is None:  # committed only once nothing else can fail
            self._sequence = sequence
            self.health.picked(picked[0], now)
            self.scheduler.profile(pool.profile).observe(scheduling, picked[0])
            default_output = exchange.snapshot.policy.limits.default_output_tokens
            expected = scheduling.prompt_tokens + (scheduling.max_output_tokens or default_output)
            exchange.leases.append(Lease(picked[0], expected))
            exchange.routed_at = self._clock()
            exchange.outcome = "routed"
            self._metrics.in_flight.inc()
        addresses = tuple(ep.address for ep in picked)
        envoy = exchange.snapshot.policy.envoy
        headers: list[tuple[str, str]] = [
            (envoy.cluster_header, pool.name),
            (envoy.endpoint_header, ",".join(addresses)),
        ]
        if new_body is not None:
            headers.append(("content-length", str(len(new_body))))
        return Route(pool.name, addresses, tuple(headers), new_body, route_metadata(exchange))

    def _usable(self, pool: PoolConfig, now: float) -> list[Endpoint]:
        state = self._registry.pool(pool.name)
        return self.health.usable(state.endpoints, now) if state is not None else []

    def record_outcome(self, address: str, pool_name: str | None, ok: bool, latency_s: float | None = None) -> None:
        """A finished exchange's outcome on the endpoint that served it, from Envoy's access log.

        Feeds the circuit breakers and the latency EWMA (time to the response headers).
        """
        state = self._registry.pool(pool_name) if pool_name else None
        endpoints = state.endpoints if state is not None else []
        if self.health.record(address, ok, self._clock(), endpoints):
            self._metrics.ejections.labels(pool_name or "none").inc()
        if ok and latency_s is not None:
            endpoint = next((e for e in endpoints if e.address == address), None)
            if endpoint is not None:
                previous = endpoint.latency_ewma_s
                endpoint.latency_ewma_s = latency_s if previous is None else (
                    previous + _LATENCY_EWMA_ALPHA * (latency_s - previous))

    def explain(self, head: RequestHead, body: bytes, tenant: Tenant | None = None) -> dict[str, Any]:
        """The decision this request would get now, with every endpoint's scores; nothing is sent or kept.
        `tenant`: decide as that tenant (no key is checked: explain must not tell valid keys from others)."""
        exchange, early = self.request_headers(head, tenant)
        exchange.cpu_started = self._cpu_clock()
        explanation = Explanation()
        try:
            decision: Decision = early if early is not None else self._route(exchange, body, explanation)
        except ApiError as error:
            decision = error_response(error)
        result: dict[str, Any] = {"config_version": exchange.snapshot.version, "model": exchange.model or None,
                                  "pool": exchange.pool or None}
        if isinstance(decision, Route):
            pool = exchange.snapshot.by_name[decision.pool]
            result.update(decision="route", profile=pool.profile, endpoints=list(decision.endpoints),
                          set_headers=dict(decision.set_headers), body_rewritten=decision.body is not None,
                          filtered_out=explanation.filtered_out, scores=explanation.scores,
                          totals=explanation.totals)
        else:
            result.update(decision="respond", status=decision.status, body=json.loads(decision.body or b"null"))
        return result

    def failed(self, exchange: Exchange) -> None:
        """Our own error ended the exchange (a 500): it reached no model, so it is charged nothing."""
        exchange.outcome = "internal_error"
        exchange.status = 500

    def _reject(self, exchange: Exchange, error: ApiError) -> Respond:
        exchange.outcome = f"rejected_{error.status}"
        exchange.status = error.status
        return error_response(error, who(exchange))

    # -- outcome --------------------------------------------------------------------------------
    def response_headers(self, exchange: Exchange, status: int) -> tuple[tuple[str, str], ...]:
        """Record the status; returns headers to add to the response (x-ratelimit-*)."""
        exchange.status = status
        return ratelimit_headers(exchange.limit_states) if exchange.limit_states else ()

    def finish(self, exchange: Exchange) -> Reservation | None:
        """End of the exchange (normal end, client disconnect or reset): release everything once.

        Returns the reservation whose concurrency leases the server must release in the store.
        """
        if exchange.finished:
            return None
        exchange.finished = True
        if exchange.holds_slot:
            self.tenants.drop(exchange.tenant)
        if exchange.ticket is not None:
            self.flow.leave(exchange.ticket)
        for lease in exchange.leases:
            lease.release()
        if exchange.leases:
            self.flow.kick(exchange.pool)
        if exchange.routed_at is not None:
            self._metrics.in_flight.dec()
            self._metrics.duration_seconds.labels(exchange.pool).observe(self._clock() - exchange.routed_at)
        model = exchange.model if exchange.model in exchange.snapshot.by_model else "unknown"
        self._metrics.requests.labels(model, exchange.pool or "none", exchange.outcome).inc()
        return exchange.reservation
