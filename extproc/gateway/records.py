"""What each stage of a request's decision learned, as immutable records, and the exchange that collects them.

authenticate -> `Caller` (headers phase), resolve -> `Resolved` (body), admit -> `Admitted` (limits store),
schedule -> `Routed`. The stream processor keeps one `Exchange` per HTTP exchange: which records exist so far
and how it ended; `finish` releases what they hold. What the records tell Envoy's dynamic metadata (namespace
`extproc`: who asked for what, for the access log's settlement and calibration and for the audit log) is
computed from them here.
"""

from __future__ import annotations

import itertools
import json
import secrets
from dataclasses import dataclass
from typing import Any

from extproc.config import PoolConfig
from extproc.config.schema import TierConfig
from extproc.endpoints import Lease
from extproc.flow import Ticket
from extproc.gateway.runtime import Runtime
from extproc.gateway.types import RequestHead, Respond, Route
from extproc.gateway.usage import encode_reservation
from extproc.limits.types import LimitState, Reservation
from extproc.openai import Api, ApiError, InferenceRequest
from extproc.openai.apis import SHAPES
from extproc.scheduling import Explanation
from extproc.tenants import ANONYMOUS, Tenant

__all__ = ["JSON_HEADERS", "Admitted", "Caller", "Exchange", "RequestIds", "Resolved", "Routed", "error_response",
           "refusal", "route_metadata", "trace_attributes", "who"]

# gen_ai.operation.name per API (OpenTelemetry GenAI semantic conventions); other APIs use their own name.
_OPERATIONS = {Api.CHAT: "chat", Api.MESSAGES: "chat", Api.RESPONSES: "chat", Api.COMPLETIONS: "text_completion",
               Api.EMBEDDINGS: "embeddings"}

JSON_HEADERS = (("content-type", "application/json"),)


class RequestIds:
    """Our request ids: this process's random replica id and a counter (unique across replicas and restarts,
    and cheaper than a uuid4 per request). No client chooses them; `mine` tells this process's own."""

    def __init__(self, replica_id: str | None = None) -> None:
        self.replica_id = replica_id or secrets.token_hex(6)
        self._prefix = self.replica_id + "-"
        self._counter = itertools.count(1)

    def __call__(self) -> str:
        return f"{self._prefix}{next(self._counter):x}"

    def mine(self, request_id: str) -> bool:
        return request_id.startswith(self._prefix)


@dataclass(frozen=True, slots=True)
class Caller:
    """What the headers phase learned: who asks, under which policy, in which priority class."""

    request_id: str  # ours (never the client's x-request-id): names leases, reservations, audit lines
    head: RequestHead
    runtime: Runtime
    api: Api
    tenant: Tenant
    tier: TierConfig
    klass: str  # flow-control priority class ("" when flow control is off)
    budgeted: bool  # it has token budgets: the engine's output must be bounded by the reservation


@dataclass(frozen=True, slots=True)
class Resolved:
    """What the body said, checked and bounded: the request as the engine will see it, and its pool."""

    request: InferenceRequest
    pool: PoolConfig
    body_changed: bool  # the content guard masked text, or an output cap applied
    prompt_estimate: int  # raw character estimate of the prompt's tokens (calibration learns from it)
    prompt_tokens: int  # the estimate as calibrated against the pool's real counts
    tokens: int  # what admission reserves: the prompt fit's upper bound + the output bound


@dataclass(frozen=True, slots=True)
class Admitted:
    """The limits store's yes: the reservation to settle, the limits' states and the rate-limit headers they give
    (x-ratelimit-*, anthropic-ratelimit-* on the Messages API), fixed at admission."""

    reservation: Reservation
    states: tuple[LimitState, ...]
    holds_slot: bool  # holds one of the tenant's tenant-wide concurrency leases (TenantGate counts it)
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Routed:
    """Where it went: the pool that serves (a backup pool may stand in) and its leases on endpoints."""

    pool: str
    route: Route
    leases: tuple[Lease, ...]
    at: float


@dataclass(slots=True, eq=False)
class Exchange:
    """One HTTP exchange as the stream processor follows it: the records so far and how it ended."""

    started: float
    request_id: str
    caller: Caller | None = None
    resolved: Resolved | None = None
    admitted: Admitted | None = None
    ticket: Ticket | None = None  # its place in the admission queue, while it has one
    routed: Routed | None = None
    outcome: str = "incomplete"
    status: int | None = None
    finished: bool = False
    scores: Explanation | None = None  # set only for a traced (sampled) exchange: scheduling records its scores
    parse_reserved: float = 0.0  # parse budget charged at the headers for the body to come (TenantGate.reserve)

    @property
    def runtime(self) -> Runtime | None:
        return self.caller.runtime if self.caller is not None else None


def error_response(error: ApiError, metadata: dict[str, Any] | None = None, api: Api | None = None) -> Respond:
    """The refusal in the API's own error shape (Anthropic's on the Messages path, else OpenAI's)."""
    anthropic = api is not None and SHAPES[api].anthropic_errors
    return Respond(error.status, error.body(anthropic), JSON_HEADERS + error.headers,
                   details=error.code or error.type, metadata=metadata)


def who(caller: Caller, resolved: Resolved | None = None) -> dict[str, Any]:
    """Who asked for what, as far as known: Envoy's dynamic metadata for the access and audit logs."""
    # Ours, never the client's x-request-id (Envoy's access log has that one as the request's own header).
    meta: dict[str, Any] = {"request_id": caller.request_id}
    tenant = caller.tenant
    if tenant is not ANONYMOUS or caller.runtime.policy.auth.mode == "none":
        meta["tenant"] = tenant.name
    if tenant.key:
        meta["key"] = tenant.key
    if resolved is not None:
        meta["model"] = resolved.request.model
    return meta


def route_metadata(caller: Caller, resolved: Resolved, pool: str, admitted: Admitted | None) -> dict[str, Any]:
    """Carried in Envoy's dynamic metadata to the access log, where any replica can settle usage and learn
    how its prompt estimate compares with the engine's count."""
    meta = who(caller, resolved)
    meta["pool"] = pool
    meta["prompt_estimate"] = resolved.prompt_estimate
    if admitted is not None:
        meta["reservation"] = encode_reservation(admitted.reservation)
        if admitted.headers and caller.runtime.policy.mode != "endpoint-picker":
            # Envoy adds them to the response from here (render.py): no response-headers message to us.
            meta.update(admitted.headers)
    return meta


def refusal(exchange: Exchange, error: ApiError, api: Api | None = None) -> Respond:
    """The exchange ends with `error`, in its API's shape, before reaching any model (`api`: the path's, when
    the caller is not known yet)."""
    exchange.outcome = f"rejected_{error.status}"
    exchange.status = error.status
    caller = exchange.caller
    meta = who(caller, exchange.resolved) if caller is not None else {"request_id": exchange.request_id}
    return error_response(error, meta, caller.api if caller is not None else api)


def trace_attributes(exchange: Exchange, now: float) -> dict[str, Any]:
    """What a decision span records of the exchange (GenAI conventions where they apply, else `extproc.*`)."""
    attributes: dict[str, Any] = {"extproc.request_id": exchange.request_id, "extproc.outcome": exchange.outcome,
                                  "http.response.status_code": exchange.status}
    caller = exchange.caller
    if caller is not None:
        attributes.update({"gen_ai.operation.name": _OPERATIONS.get(caller.api, caller.api.value),
                           "gen_ai.provider.name": "vllm", "extproc.api": caller.api.value,
                           "extproc.tenant": caller.tenant.name, "extproc.priority_class": caller.klass or None})
    resolved = exchange.resolved
    if resolved is not None:
        request = resolved.request
        attributes.update({"gen_ai.request.model": request.model, "gen_ai.request.max_tokens": request.output_tokens,
                           "extproc.pool": resolved.pool.name, "extproc.profile": resolved.pool.profile,
                           "extproc.prompt_tokens_estimate": resolved.prompt_tokens,
                           "extproc.reserved_tokens": resolved.tokens if exchange.admitted is not None else None,
                           "extproc.stream": request.stream})
    routed = exchange.routed
    if routed is not None:
        attributes.update({"extproc.pool": routed.pool, "server.address": routed.route.endpoints[0],
                           "extproc.fallbacks": ",".join(routed.route.endpoints[1:]),
                           # From the request headers to the pick: parsing, limits and any admission queue wait.
                           "extproc.decision_ms": round((routed.at - exchange.started) * 1000, 3)})
        if exchange.scores is not None:
            attributes.update(score_attributes(exchange.scores, routed.route.endpoints[0]))
    attributes["extproc.exchange_ms"] = round((now - exchange.started) * 1000, 3)
    return attributes


SCORED_ENDPOINTS_MAX = 8  # endpoints in `extproc.scores`, best totals first


def score_attributes(scores: Explanation, picked: str) -> dict[str, Any]:
    """The picked endpoint's score from each scorer (`extproc.score.<scorer>`) and in total, how many endpoints
    were scored or filtered out, and the best-scored endpoints' scores as JSON (bounded), as /debug/explain
    shows them."""
    attributes: dict[str, Any] = {f"extproc.score.{name}": round(value, 4)
                                  for name, value in scores.scores.get(picked, {}).items()}
    best = sorted(scores.totals.items(), key=lambda item: -item[1])[:SCORED_ENDPOINTS_MAX]
    attributes.update({
        "extproc.score_total": round(scores.totals[picked], 4) if picked in scores.totals else None,
        "extproc.scored_endpoints": len(scores.totals), "extproc.filtered_out": len(scores.filtered_out),
        "extproc.scores": json.dumps({address: {"total": round(total, 4), **{
            name: round(value, 4) for name, value in scores.scores.get(address, {}).items()}}
            for address, total in best}, separators=(",", ":"))})
    return attributes
