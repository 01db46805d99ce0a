"""The ext_proc filter of policy mode, as `extproc envoy render` and the Helm chart's EnvoyFilter configure it.

Request headers are always sent: the router must not pick a route before the body is decided (with headers
SKIP it picks one at once and answers 503). How the body follows (`envoy.request_body_mode`):

- **buffered**: Envoy sends the body only after our reply to the headers, so every request pays two
  sequential round trips to the service.
- **streamed** (`send_body_without_waiting_for_header_response`): Envoy sends the body chunks right behind the
  headers, without waiting for their reply; the service holds the headers reply until the body is decided,
  then answers it with the routing mutations (and `clear_route_cache`), followed by one reply per chunk
  (extproc/server/processor.py). One round trip less, same number of messages, and fail-open keeps working
  (FULL_DUPLEX_STREAMED turns it off once a body was sent, so policy mode refuses it).
- **prebuffered**: Envoy's buffer filter, ahead of ext_proc, holds the request until its whole body has arrived
  (bounded like buffered bodies, 413 beyond), then ext_proc sends the headers and the whole body as one STREAMED
  chunk with end_of_stream, without waiting for the headers reply: one round trip and 2 messages each way (plain
  streamed costs 3: Envoy's HTTP/1 codec follows the data with an empty end-of-stream chunk). The client's upload
  happens before the service sees the request, as with buffered, so no held reply waits on a slow client.
"""

from __future__ import annotations

from typing import Any

from extproc.config import Policy
from extproc.flow.config import MESSAGE_TIMEOUT_SLACK_S
from extproc.xds.logs import extproc_grpc_service

__all__ = ["BODY_MODE", "HOLDS_HEADERS", "buffer_filter", "ext_proc_filter", "max_message_timeout_s"]

_T = "type.googleapis.com/envoy."
# Policy mode's request body modes, as Envoy names them (full-duplex: endpoint-picker mode only).
BODY_MODE = {"buffered": "BUFFERED", "prebuffered": "STREAMED", "streamed": "STREAMED"}
# The modes whose headers reply the service holds until the body is decided (send_body_without_waiting).
HOLDS_HEADERS = frozenset({"prebuffered", "streamed"})


def max_message_timeout_s(policy: Policy) -> float:
    """How long the service may make Envoy wait for a reply: a queued request's class's longest wait plus slack;
    streamed, also a client's upload while the headers reply is held (up to the request timeout, which answers
    408 itself: extproc/server/nudge.py `UploadNudge`). Prebuffered holds the reply only once the whole body
    has arrived: no upload to wait for, the timers are buffered's."""
    longest = policy.longest_wait_s()
    max_wait_s = longest + MESSAGE_TIMEOUT_SLACK_S + 1.0 if longest > 0 else 0.0
    if policy.envoy.request_body_mode == "streamed":
        max_wait_s = max(max_wait_s, (policy.request_timeout_s() or 3600.0) + 1.0)
    return max(policy.envoy.message_timeout_ms / 1000, max_wait_s)


def ext_proc_filter(policy: Policy) -> dict[str, Any]:
    envoy = policy.envoy
    config: dict[str, Any] = {
        "@type": _T + "extensions.filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": extproc_grpc_service(policy),
        # Fail open: a routed exchange outlives our service; unrouted requests are stopped by the
        # route table (extproc/xds/render.py), not here.
        "failure_mode_allow": True,
        # A slow or unreachable processor answers 500 (mapped to an OpenAI error), not Envoy's 504.
        "status_on_error": {"code": 500},
        # Envoy drops dynamic metadata from the processor unless its namespace is accepted.
        "metadata_options": {"receiving_namespaces": {"untyped": ["extproc"]}},
        "message_timeout": f"{envoy.message_timeout_ms / 1000:g}s",
        # Queued requests (flow control) extend the timer up to their class's longest wait.
        "max_message_timeout": f"{max_message_timeout_s(policy):g}s",
        # No response phase: rate-limit headers come from our metadata (header_mutation),
        # outcomes from the access log.
        "processing_mode": {
            "request_header_mode": "SEND",
            "response_header_mode": "SKIP",
            "request_body_mode": BODY_MODE[envoy.request_body_mode],
            "response_body_mode": "NONE",
            "request_trailer_mode": "SKIP",
            "response_trailer_mode": "SKIP",
        },
    }
    if envoy.request_body_mode in HOLDS_HEADERS:
        config["send_body_without_waiting_for_header_response"] = True
        # With nothing of the response to process, Envoy 1.40 closes a streamed body's gRPC stream as soon as the
        # body is answered, and the service releases the exchange's leases at the stream's end: trailers SEND
        # keeps the stream open until the exchange ends (measured: a response without trailers costs no message).
        config["processing_mode"]["response_trailer_mode"] = "SEND"
    return {"name": "envoy.filters.http.ext_proc", "typed_config": config}


def buffer_filter(policy: Policy) -> list[dict[str, Any]]:
    """Prebuffered: Envoy's buffer filter, right before ext_proc, holds the request until its body is complete (up to
    the listener's buffer limit: Envoy answers 413 beyond it, as it does for buffered ext_proc bodies); nothing in
    the other modes."""
    if policy.envoy.request_body_mode != "prebuffered":
        return []
    return [{"name": "envoy.filters.http.buffer", "typed_config": {
        "@type": _T + "extensions.filters.http.buffer.v3.Buffer",
        "max_request_bytes": request_buffer_bytes(policy)}}]


def request_buffer_bytes(policy: Policy) -> int:
    """The most request body Envoy holds for ext_proc: the policy's max body plus headroom (bodies between the two
    get the service's own 413)."""
    return policy.bounds.max_body_bytes + 65536
