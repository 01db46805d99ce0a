"""The ext_proc gRPC service: one `StreamProcessor` per HTTP exchange (one gRPC stream)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from grpc.aio import EOF  # type: ignore[attr-defined]  # missing from grpc-stubs
from prometheus_client import CollectorRegistry

from extproc.config.epp import (
    DESTINATION_ENDPOINT,
    DESTINATION_ENDPOINT_SERVED,
    DESTINATION_ENDPOINT_SUBSET,
    EndpointPickerConfig,
)
from extproc.flow import Rejected, Ticket
from extproc.gateway import BodyPhase, Decision, Exchange, Gateway, Respond, Route, Wait, error_response
from extproc.gateway.records import trace_attributes
from extproc.limits.types import AdmitRequest, AdmitResult, Reservation, Store
from extproc.openai import errors as oai
from extproc.scheduling import Explanation
from extproc.server import protocol
from extproc.server.grpc_auth import authorized, refuse
from extproc.server.nudge import UploadNudge
from extproc.telemetry import GatewayMetrics

if TYPE_CHECKING:  # the SDK is imported only when tracing is on (extproc/telemetry/tracing.py)
    from opentelemetry.trace import Span

    from extproc.telemetry.tracing import DecisionTracer

log = logging.getLogger(__name__)

# A failure in these phases means the routing decision never reached Envoy (no model saw the request); later
# ones (response headers) come after the exchange was served, which the access log settles.
_DECISION_PHASES = frozenset({"request_headers", "request_body", "request_trailers"})
_INTERNAL_ERROR = Respond(500, oai.ApiError(500, "internal gateway error", "server_error").body(),
                          (("content-type", "application/json"),), "internal_error")
_STREAMED_NEEDS_BODY = Respond(500, oai.ApiError(
    500, "The gateway is misconfigured: its ext_proc filter streams the body only after the headers are answered",
    "server_error", "gateway_error").body(), (("content-type", "application/json"),), "streamed_body_misconfigured")
_NOT_PREBUFFERED = Respond(500, oai.ApiError(
    500, "The gateway is misconfigured: request_body_mode prebuffered needs Envoy's buffer filter ahead of ext_proc",
    "server_error", "gateway_error").body(), (("content-type", "application/json"),), "prebuffered_body_misconfigured")
# A streamed body of more messages than this is refused like an oversized one (each message costs a reply).
_MAX_BODY_MESSAGES = 65536
# Bodies this large are decided one at a time, each after the messages already waiting: decoding one holds the loop
# for tens of ms (3.5 MB: ~30 ms of CPU, ~100 ms on a third of a core), and eight in a row held other tenants'
# messages past Envoy's message_timeout (issue 14 item 4, reports/suite-s13). A chat body is ~1-100 KB.
_LARGE_BODY = 256 * 1024
Reply: TypeAlias = "ext_pb.ProcessingResponse | tuple[ext_pb.ProcessingResponse, ...] | Wait | None"


class StreamProcessor:
    """Protocol state of one exchange: its phase, its Exchange, the request body as Envoy streams it, and the body
    phase while it waits on something.

    Body modes (Envoy names them in the stream's first message): BUFFERED (and unknown: an Envoy that does not
    say) answers the request headers at once and decides on the whole body, as policy mode always did.
    FULL_DUPLEX_STREAMED and STREAMED with `send_body_without_waiting_for_header_response` hold the headers
    reply until the body is complete and decided (the router picks the upstream when the headers continue), then
    answer the headers with the pick and give the body back: FULL_DUPLEX as streamed pieces, STREAMED as one
    reply per chunk. STREAMED while Envoy waits for the headers reply cannot be routed by its body and is refused
    (500, a data-plane misconfiguration) rather than sent somewhere unpicked. Response bodies pass untouched."""

    __slots__ = ("body", "chunks", "closed", "count", "declared", "exchange", "gateway", "hold", "picker", "received",
                 "request_mode", "response_mode", "rewritten", "span", "stream_metadata", "tracer", "trailers",
                 "trailing", "whole")

    def __init__(self, gateway: Gateway, tracer: DecisionTracer | None = None,
                 stream_metadata: Iterable[tuple[str, str]] | None = None) -> None:
        self.gateway = gateway
        self.exchange: Exchange | None = None
        self.body: BodyPhase | None = None  # the decision in progress, waiting on the store or a ticket
        self.hold = False  # the request headers reply waits for the decision
        self.request_mode = self.response_mode = 0  # protocol.STREAMED / FULL_DUPLEX / other
        self.picker: EndpointPickerConfig | None = None  # endpoint-picker mode's settings, from the headers on
        self.chunks: list[bytes] = []
        self.count = 0  # request body messages received (STREAMED answers each)
        self.received = 0  # request body bytes received
        self.declared = -1  # the request's content-length (-1: none)
        self.rewritten = False  # STREAMED: the decision replaced the body (later chunks are cleared)
        self.trailers = False  # the decision came with the request trailers: they get their reply after it
        self.closed = False  # answered with an immediate response: Envoy sends nothing more that needs a reply
        # The body reaches us whole, Envoy's buffer filter ahead of ext_proc (`envoy.request_body_mode: prebuffered`):
        # no client upload behind a held headers reply, nothing to nudge.
        self.whole = False
        self.trailing = False  # prebuffered: the whole body came without end_of_stream, request trailers follow it
        self.tracer = tracer  # None: tracing off (the only cost is this test)
        self.stream_metadata = stream_metadata  # the ext_proc stream's gRPC metadata (Envoy's trace context), as is
        self.span: Span | None = None

    def _immediate(self, reply: Respond) -> ext_pb.ProcessingResponse:
        self.closed = True
        return protocol.immediate_response(reply)

    def handle(self, message: ext_pb.ProcessingRequest, phase: str | None) -> Reply:
        """Answer one message (`phase`: its WhichOneof("request"))."""
        if self.closed:
            return None
        if phase == "request_headers":
            return self._request_headers(message)
        if phase == "request_body":
            return self._request_body(message.request_body)
        if phase == "response_headers":
            if self.exchange is None:
                return protocol.CONTINUE_RESPONSE_HEADERS
            status = protocol.response_status(message.response_headers)
            picker = self.picker
            served = protocol.metadata_value(message.metadata_context, picker.metadata_namespace,
                                             DESTINATION_ENDPOINT_SERVED) if picker is not None else None
            add = self.gateway.response_headers(self.exchange, status, served[0] if served else None)
            return protocol.response_headers_response(add)
        if phase == "response_body":
            if self.response_mode == protocol.FULL_DUPLEX:
                chunk = message.response_body
                return protocol.streamed_response_body(chunk.body, chunk.end_of_stream)
            return protocol.CONTINUE_RESPONSE_BODY
        if phase == "request_trailers":
            exchange = self.exchange
            if self.hold and exchange is not None and exchange.outcome == "incomplete" and self.body is None:
                self.trailers = True  # a body that ends with trailers: decide now
                return self._decide()
            return protocol.CONTINUE_REQUEST_TRAILERS
        if phase == "response_trailers":
            return ext_pb.ProcessingResponse(response_trailers=ext_pb.TrailersResponse())
        return None

    def _request_headers(self, message: ext_pb.ProcessingRequest) -> Reply:
        if message.HasField("protocol_config"):
            config = message.protocol_config
            self.request_mode, self.response_mode = config.request_body_mode, config.response_body_mode
            without_waiting = config.send_body_without_waiting_for_header_response
            self.hold = self.request_mode == protocol.FULL_DUPLEX or (
                self.request_mode == protocol.STREAMED and without_waiting)
            if self.request_mode == protocol.STREAMED and not without_waiting:
                log.error("ext_proc request_body_mode STREAMED without send_body_without_waiting_for_header_response:"
                          " the route is chosen before the body is seen; refusing (fix the data plane's filter)")
                return self._immediate(_STREAMED_NEEDS_BODY)
        policy = self.gateway.runtimes.current.policy
        self.whole = self.hold and policy.envoy.request_body_mode == "prebuffered"
        subset = None
        if policy.mode == "endpoint-picker":
            self.picker = picker = policy.endpoint_picker
            hint = protocol.metadata_value(message.metadata_context, picker.subset_namespace,
                                           DESTINATION_ENDPOINT_SUBSET)
            subset = tuple(hint) if hint is not None else None
        head = protocol.request_head(message.request_headers, subset)
        declared = head.headers.get("content-length", "")
        if declared.isdigit():
            self.declared = int(declared)
        if self.tracer is not None:
            self.span = self.tracer.start(head.headers, self.stream_metadata)
        exchange, reply = self.gateway.headers(head)
        self.exchange = exchange
        if self.span is not None:  # sampled: scheduling records its scores for the span (nothing otherwise)
            exchange.scores = Explanation()
        if reply is not None:
            return self._immediate(reply)
        if self.hold:
            return None  # answered with the decision, once the body is complete
        return protocol.CONTINUE_REQUEST_HEADERS

    def _request_body(self, chunk: ext_pb.HttpBody) -> Reply:
        exchange = self.exchange
        if exchange is None:
            return protocol.immediate_response(error_response(oai.bad_request("body before headers")))
        if self.body is not None or exchange.outcome != "incomplete":
            return self._after_decision(chunk)
        self.count += 1
        self.received += len(chunk.body)
        limit = self.gateway.runtimes.current.policy.bounds.max_body_bytes
        if self.received > limit or self.count > _MAX_BODY_MESSAGES:
            return self._immediate(self.gateway.refuse(exchange, oai.too_large(limit)))
        self.chunks.append(chunk.body)
        if self.whole:  # prebuffered: the first chunk is the whole body, request trailers may follow it
            if self.received < self.declared:  # no buffer filter ahead of ext_proc: never decide on part of a body
                log.error("request_body_mode prebuffered, but a body arrived in pieces: Envoy's buffer filter must "
                          "precede ext_proc (render the data plane from the policy); refusing")
                return self._immediate(_NOT_PREBUFFERED)
            self.trailing = not chunk.end_of_stream
        elif self.hold and not chunk.end_of_stream and not self._declared_complete():
            return None  # more to come
        return self._decide()

    def _declared_complete(self) -> bool:
        """STREAMED: the body's declared length has arrived. Envoy's HTTP/1 codec follows the data with an empty
        end-of-stream chunk; deciding now takes that message's round trip off the request's path (it gets its
        reply when it comes). Not in FULL_DUPLEX, whose reply ends the body Envoy sends upstream."""
        return self.request_mode == protocol.STREAMED and self.declared == self.received

    def _after_decision(self, chunk: ext_pb.HttpBody) -> Reply:
        """A piece after the decision: STREAMED owes every routed chunk a reply (empty by the declared length; a
        rewritten body already replaced the first chunk, so anything after it is cleared); otherwise nothing."""
        if self.request_mode != protocol.STREAMED or not self.hold or self.exchange is None or (
                self.exchange.outcome != "routed"):
            return None
        return protocol.CLEAR_REQUEST_BODY if self.rewritten or chunk.body else protocol.CONTINUE_REQUEST_BODY

    def _decide(self) -> Reply:
        assert self.exchange is not None
        whole = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)  # one copy at most
        self.chunks = [whole]
        self.body = self.gateway.body(self.exchange, whole)
        return self.resume(None)

    def resume(self, answer: AdmitResult | Rejected | None) -> Reply:
        """Continue the body phase with the answer to what it waited for: the next wait, or Envoy's reply."""
        assert self.body is not None
        try:
            return self.body.send(answer)
        except StopIteration as done:
            self.body = None
            return self.respond(done.value)

    def respond(self, decision: Decision) -> Reply:
        if not isinstance(decision, Route):
            return self._immediate(decision)
        if self.span is not None and self.tracer is not None:  # the engine's parent is our span
            decision = replace(decision, set_headers=(*decision.set_headers,
                                                      ("traceparent", self.tracer.traceparent(self.span))))
        picker = self.picker
        pick = (picker.metadata_namespace, DESTINATION_ENDPOINT) if picker is not None else None
        if not self.hold:
            return protocol.route_response(decision, pick)
        body = decision.body if decision.body is not None else self.chunks[0]
        if self.trailing:
            # Prebuffered with request trailers: Envoy 1.40 forwards more than the answered chunk (the engine got
            # extra bytes after the body; tests/integration/spine/test_h2_clients.py). The headers reply carries
            # the whole body (CONTINUE_AND_REPLACE) and the queued chunk is cleared.
            self.chunks, self.rewritten = [], True
            return protocol.replacing_headers_response(decision, pick, body), protocol.CLEAR_REQUEST_BODY
        replies = [protocol.held_headers_response(decision, pick)]
        if self.request_mode == protocol.FULL_DUPLEX:
            replies += protocol.streamed_request_body(body, end_of_stream=not self.trailers)
        else:
            replies += protocol.streamed_chunk_replies(self.count, decision.body)
            self.rewritten = decision.body is not None
        self.chunks = []
        if self.trailers:
            replies.append(protocol.CONTINUE_REQUEST_TRAILERS)
        return tuple(replies)

    def large_body(self, chunk: bytes) -> bool:
        """Whether this request body message may start a decision on a body of _LARGE_BODY bytes or more."""
        exchange = self.exchange
        return (exchange is not None and exchange.outcome == "incomplete" and self.body is None and not self.closed
                and self.received + len(chunk) >= _LARGE_BODY)

    @property
    def uploading(self) -> bool:
        """STREAMED with the headers reply held and the body still arriving from the client (not prebuffered: the
        buffer filter received it whole before Envoy sent the headers): Envoy times each message it sent."""
        exchange = self.exchange
        return (self.hold and self.request_mode == protocol.STREAMED and not self.whole and not self.closed
                and self.body is None and exchange is not None and exchange.outcome == "incomplete")

    @property
    def extends_timer(self) -> bool:
        """Whether a held decision may ask Envoy for more time (override_message_timeout): not in FULL_DUPLEX,
        where Envoy runs no per-message timer (measured with Envoy 1.40: a decision held 2.5 s past a 1 s
        message_timeout was served)."""
        return bool(self.request_mode != protocol.FULL_DUPLEX)

    def end_span(self, now: float) -> None:
        """The exchange is over: its span records it, and ends once its usage arrives (routed) or now."""
        if self.span is None or self.tracer is None or self.exchange is None:
            return
        exchange = self.exchange
        self.tracer.finish(self.span, trace_attributes(exchange, now),
                           exchange.request_id if exchange.routed is not None else None)
        self.span = None


class ExternalProcessorService(ext_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, gateway: Gateway, store: Store, token: str | None = None,
                 metrics: GatewayMetrics | None = None, tracer: DecisionTracer | None = None) -> None:
        self._gateway = gateway
        self._tracer = tracer
        self._store = store
        self._token = token  # shared secret Envoy sends (grpc_auth.py); None = no check
        self._metrics = metrics if metrics is not None else GatewayMetrics(CollectorRegistry())
        self._phase_cpu = {phase: counter.inc for phase, counter in self._metrics.phase_cpu.items()}
        self._streams = self._metrics.streams.inc
        self._large_bodies = asyncio.Lock()  # see _LARGE_BODY

    @contextlib.asynccontextmanager
    async def _turn(self) -> AsyncIterator[None]:
        """A large body's turn: alone, and behind what became ready meanwhile (the lock wakes waiters in order)."""
        async with self._large_bodies:
            await asyncio.sleep(0)
            yield

    async def Process(
        self, request_iterator: AsyncIterator[ext_pb.ProcessingRequest], context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        if self._token is not None and not authorized(context, self._token):
            self._metrics.refused_streams.labels("ext_proc").inc()
            await refuse(context)
            return
        self._streams()
        cpu = time.thread_time  # CPU of the loop's thread per phase: our own work, not the awaits in between
        # read()/write() on the context instead of an async generator: one less layer per message.
        tracer = self._tracer
        stream = StreamProcessor(self._gateway, tracer, None if tracer is None else context.invocation_metadata())
        nudge: UploadNudge | None = None
        try:
            while True:
                if stream.uploading:
                    nudge = nudge or UploadNudge(context)
                    policy = self._gateway.runtimes.current.policy
                    timer = asyncio.get_running_loop().call_later(
                        policy.envoy.message_timeout_ms / 2000, nudge.fire, policy.request_timeout_s() or 3600.0)
                    message = await context.read()
                    timer.cancel()
                    await nudge.settle()
                else:
                    message = await context.read()
                if message is EOF:
                    return
                phase = message.WhichOneof("request")
                started = cpu()
                used = 0.0
                try:
                    if phase == "request_body" and stream.large_body(message.request_body.body):
                        async with self._turn():
                            started = cpu()
                            response = stream.handle(message, phase)
                    else:
                        response = stream.handle(message, phase)
                    while isinstance(response, AdmitRequest | Ticket):
                        used += cpu() - started
                        if isinstance(response, AdmitRequest):
                            # One store round trip, bounded by its deadline.
                            answer: AdmitResult | Rejected | None = await self._store.admit(response)
                        else:
                            # The pool is saturated: hold the reply (Envoy's timer extended to the class's wait).
                            if stream.extends_timer:
                                await context.write(
                                    protocol.extend_message_timeout(response.deadline - time.monotonic()))
                            answer = await response.wait()
                        started = cpu()
                        response = stream.resume(answer)
                except Exception:  # a bug must not take the exchange down with a gRPC error
                    log.exception("ext_proc message handling failed")
                    if stream.exchange is not None and phase in _DECISION_PHASES:
                        self._gateway.failed(stream.exchange)  # its decision never reached Envoy: no charge
                    response = protocol.immediate_response(_INTERNAL_ERROR)
                if phase in self._phase_cpu:
                    self._phase_cpu[phase](used + cpu() - started)
                if isinstance(response, ext_pb.ProcessingResponse):
                    await context.write(response)
                elif response is not None:
                    for reply in response:
                        await context.write(reply)
                if stream.closed and stream.hold:
                    return  # answered at once: the rest of a streamed body is not read (nor paid for)
        finally:
            # The stream ends when the HTTP exchange ends (or the client goes away): release here.
            started = cpu()
            if stream.body is not None:
                stream.body.close()  # the client left while the decision waited: nothing more is decided
            held, routed = None, False
            if stream.exchange is not None:
                routed = stream.exchange.outcome == "routed"
                held = self._gateway.finish(stream.exchange)
                if stream.span is not None:
                    stream.end_span(time.monotonic())
            self._phase_cpu["stream_end"](cpu() - started)
            if held is not None:
                await self._give_back(held, routed)

    async def _give_back(self, held: Reservation, routed: bool) -> None:
        """Release the concurrency leases; a request that never reached a model is charged nothing
        (no access-log usage will come for it)."""
        try:
            if held.concurrency:
                await self._store.release(held, time.time())
            if not routed and held.budgets:
                await self._store.settle(held, 0, time.time())
        except Exception:  # leases then expire by their TTL; never fail the stream over it
            log.exception("releasing the reservation of an exchange failed")
