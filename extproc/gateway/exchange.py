"""One HTTP exchange's routing state, and what it tells Envoy's dynamic metadata (namespace `extproc`):
who asked for what, for the access log (usage settlement, prompt calibration) and the audit log."""

from __future__ import annotations

import itertools
import secrets
from dataclasses import dataclass, field
from typing import Any

from extproc.endpoints import Lease
from extproc.flow import Ticket
from extproc.gateway.snapshot import Snapshot
from extproc.gateway.types import RequestHead, Respond
from extproc.gateway.usage import encode_reservation
from extproc.limits.types import AdmitRequest, LimitState, Reservation
from extproc.openai import Api, ApiError, InferenceRequest
from extproc.tenants import ANONYMOUS, Tenant

__all__ = ["JSON_HEADERS", "Exchange", "Queued", "RequestIds", "error_response", "route_metadata", "who"]

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


@dataclass(slots=True, eq=False)
class Exchange:
    """Routing state of one HTTP exchange, from request headers to the end of the stream."""

    head: RequestHead
    snapshot: Snapshot
    api: Api | None
    started: float
    request: InferenceRequest | None = None
    pool: str = ""
    model: str = ""
    outcome: str = "incomplete"
    status: int | None = None
    routed_at: float | None = None
    leases: list[Lease] = field(default_factory=list)
    finished: bool = False
    tenant: Tenant = ANONYMOUS
    request_id: str = ""  # ours (never the client's x-request-id): names leases, reservations, audit lines
    admission: AdmitRequest | None = None
    reservation: Reservation | None = None
    limit_states: tuple[LimitState, ...] = ()
    body: bytes = b""
    limited: bool = False  # the tenant has limits: its responses carry x-ratelimit-* headers
    klass: str = ""  # flow-control priority class ("" when flow control is off)
    tokens: int = 0  # estimated prompt + expected completion tokens
    body_changed: bool = False  # the content guard masked text, or the tier's output cap applied
    prompt_estimate: int = 0  # raw character estimate of the prompt's tokens (calibration learns from it)
    ticket: Ticket | None = None  # its place in the admission queue, while it has one
    budgeted: bool = False  # the tenant has token budgets: the engine's output must be bounded by the reservation
    holds_slot: bool = False  # holds one of the tenant's tenant-wide concurrency leases (TenantGate counts it)
    cpu_started: float = 0.0  # CPU clock when the current decision began (the decision's CPU budget)


@dataclass(frozen=True, slots=True)
class Queued:
    """Returned when the request waits for room in its pool: the server awaits `ticket.wait()`, then
    calls `Gateway.dequeued`."""

    ticket: Ticket


def error_response(error: ApiError, metadata: dict[str, Any] | None = None) -> Respond:
    return Respond(error.status, error.body(), JSON_HEADERS + error.headers, details=error.code or error.type,
                   metadata=metadata)


def who(exchange: Exchange) -> dict[str, Any]:
    """Who asked for what, as far as known: Envoy's dynamic metadata for the access and audit logs."""
    # Ours, never the client's x-request-id (Envoy's access log has that one as the request's own header).
    meta: dict[str, Any] = {"request_id": exchange.request_id}
    tenant = exchange.tenant
    if tenant is not ANONYMOUS or exchange.snapshot.policy.auth.mode == "none":
        meta["tenant"] = tenant.name
    if tenant.key:
        meta["key"] = tenant.key
    if exchange.model:
        meta["model"] = exchange.model
    return meta


def route_metadata(exchange: Exchange) -> dict[str, Any]:
    """Carried in Envoy's dynamic metadata to the access log, where any replica can settle usage and learn
    how its prompt estimate compares with the engine's count."""
    meta = who(exchange)
    meta["pool"] = exchange.pool
    meta["prompt_estimate"] = exchange.prompt_estimate
    held = exchange.reservation
    if held is not None:
        meta["reservation"] = encode_reservation(held)
    return meta
