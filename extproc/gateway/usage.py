"""Usage accounting after the response: what the access log reports, and what to settle.

Envoy copies `usage.prompt_tokens` / `usage.completion_tokens` from the response (json_to_metadata for
JSON bodies, sse_to_metadata for streams) into dynamic metadata, next to the reservation our ext_proc
reply attached; the gRPC access log delivers both to whichever service replica Envoy picks, so the
reservation travels with the entry (compact JSON) and any replica can settle it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from extproc.limits.types import ConcurrencyLimit, Reservation, TokenBudget


@dataclass(frozen=True, slots=True)
class UsageReport:
    """One finished exchange as Envoy's access log saw it."""

    request_id: str
    status: int
    prompt_tokens: int | None
    completion_tokens: int | None
    reservation: str | None  # encoded, from our own dynamic metadata
    pool: str | None
    upstream_host: str | None
    response_flags: str = ""
    # From the start of the request: first / last byte received from upstream (TTFT / e2e proxies).
    first_byte_s: float | None = None
    last_byte_s: float | None = None
    prompt_estimate: int | None = None  # our raw estimate of the prompt's tokens, from the route's metadata
    sent_s: float | None = None  # from the start of the request: first byte sent upstream


def encode_reservation(reservation: Reservation) -> str:
    """Compact JSON: request id, tokens, admission time, budgets and concurrency leases (so that whichever
    replica gets the access log entry can settle the budgets and release the leases)."""
    return json.dumps([reservation.request_id, reservation.tokens, round(reservation.admitted_at, 3),
                       [[b.key, b.limit, b.window_s] for b in reservation.budgets],
                       [[c.key, c.limit, c.lease_ttl_s] for c in reservation.concurrency]], separators=(",", ":"))


def decode_reservation(text: str) -> Reservation | None:
    """Inverse of encode_reservation; None for anything malformed (never raises)."""
    try:
        request_id, tokens, admitted_at, budgets, *rest = json.loads(text)
        parsed = tuple(TokenBudget(str(k), int(limit), int(window)) for k, limit, window in budgets)
        leases = tuple(ConcurrencyLimit(str(k), int(limit), float(ttl)) for k, limit, ttl in (rest[0] if rest else ()))
        return Reservation(str(request_id), int(tokens), leases, parsed, float(admitted_at))
    except (ValueError, TypeError):
        return None


def settlement(report: UsageReport, held: Reservation | None = None) -> tuple[Reservation, int] | None:
    """The reservation and the tokens to charge for it, or None if there is nothing to settle.

    Missing usage after a 2xx (client disconnect, upstream reset mid-stream) keeps the reserved
    estimate: the documented charge is prompt estimate + max_tokens (or limits.default_output_tokens).
    """
    if held is None and report.reservation:
        held = decode_reservation(report.reservation)
    if held is None:
        return None
    if report.prompt_tokens is None:
        # An error status means the model never produced output (a failure mid-stream keeps the 200
        # already sent): nothing was consumed. Anything else without usage keeps the estimate.
        return (held, 0) if 400 <= report.status < 600 else None
    # Prompt tokens alone: a response shape that generates nothing (vLLM's rerank usage has no
    # completion_tokens). Every generating shape reports both counts in the same object.
    return held, max(0, report.prompt_tokens) + max(0, report.completion_tokens or 0)


