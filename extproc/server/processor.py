"""The ext_proc gRPC service: one `StreamProcessor` per HTTP exchange (one gRPC stream)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from grpc.aio import EOF  # type: ignore[attr-defined]  # missing from grpc-stubs
from prometheus_client import CollectorRegistry

from extproc.flow import Rejected
from extproc.gateway import BodyPhase, Decision, Exchange, Gateway, Respond, Route, Wait, error_response
from extproc.gateway.records import trace_attributes
from extproc.limits.types import AdmitRequest, AdmitResult, Reservation, Store
from extproc.openai import errors as oai
from extproc.server import protocol
from extproc.server.grpc_auth import authorized, refuse
from extproc.telemetry import GatewayMetrics

if TYPE_CHECKING:  # the SDK is imported only when tracing is on (extproc/telemetry/tracing.py)
    from opentelemetry.trace import Span

    from extproc.telemetry.tracing import DecisionTracer

log = logging.getLogger(__name__)

# A failure in these phases means the routing decision never reached Envoy (no model saw the request); later
# ones (response headers) come after the exchange was served, which the access log settles.
_DECISION_PHASES = frozenset({"request_headers", "request_body"})
_INTERNAL_ERROR = Respond(500, oai.ApiError(500, "internal gateway error", "server_error").body(),
                          (("content-type", "application/json"),), "internal_error")


class StreamProcessor:
    """Protocol state of one exchange: its phase, its Exchange, and the body phase while it waits on something."""

    __slots__ = ("body", "exchange", "gateway", "span", "stream_traceparent", "tracer")

    def __init__(self, gateway: Gateway, tracer: DecisionTracer | None = None,
                 stream_traceparent: str | None = None) -> None:
        self.gateway = gateway
        self.exchange: Exchange | None = None
        self.body: BodyPhase | None = None  # the decision in progress, waiting on the store or a ticket
        self.tracer = tracer  # None: tracing off (the only cost is this test)
        self.stream_traceparent = stream_traceparent  # Envoy's trace context on the ext_proc stream, if any
        self.span: Span | None = None

    def handle(self, message: ext_pb.ProcessingRequest, phase: str | None) -> ext_pb.ProcessingResponse | Wait | None:
        """Answer one message (`phase`: its WhichOneof("request"))."""
        if phase == "request_headers":
            head = protocol.request_head(message.request_headers)
            if self.tracer is not None:
                self.span = self.tracer.start(head.headers, self.stream_traceparent)
            exchange, reply = self.gateway.headers(head)
            self.exchange = exchange
            if reply is not None:
                return protocol.immediate_response(reply)
            assert exchange.caller is not None
            if exchange.caller.limited:
                return protocol.CONTINUE_REQUEST_HEADERS_SEND_RESPONSE_HEADERS
            return protocol.CONTINUE_REQUEST_HEADERS
        if phase == "request_body":
            if self.exchange is None:
                return protocol.immediate_response(error_response(oai.bad_request("body before headers")))
            self.body = self.gateway.body(self.exchange, message.request_body.body)
            return self.resume(None)
        if phase == "response_headers":
            if self.exchange is None:
                return protocol.CONTINUE_RESPONSE_HEADERS
            status = protocol.response_status(message.response_headers)
            return protocol.response_headers_response(self.gateway.response_headers(self.exchange, status))
        # Trailers/bodies arrive only if Envoy is configured to send them; answer so Envoy never waits.
        return _continue_for(phase)

    def resume(self, answer: AdmitResult | Rejected | None) -> ext_pb.ProcessingResponse | Wait:
        """Continue the body phase with the answer to what it waited for: the next wait, or Envoy's reply."""
        assert self.body is not None
        try:
            return self.body.send(answer)
        except StopIteration as done:
            self.body = None
            return self.respond(done.value)

    def respond(self, decision: Decision) -> ext_pb.ProcessingResponse:
        if isinstance(decision, Route):
            if self.span is not None and self.tracer is not None:  # the engine's parent is our span
                decision = replace(decision, set_headers=(*decision.set_headers,
                                                          ("traceparent", self.tracer.traceparent(self.span))))
            return protocol.route_response(decision)
        return protocol.immediate_response(decision)

    def end_span(self, now: float) -> None:
        """The exchange is over: its span records it, and ends once its usage arrives (routed) or now."""
        if self.span is None or self.tracer is None or self.exchange is None:
            return
        exchange = self.exchange
        self.tracer.finish(self.span, trace_attributes(exchange, now),
                           exchange.request_id if exchange.routed is not None else None)
        self.span = None


def _continue_for(phase: str | None) -> ext_pb.ProcessingResponse | None:
    if phase == "response_body":
        return ext_pb.ProcessingResponse(response_body=ext_pb.BodyResponse())
    if phase == "request_trailers":
        return ext_pb.ProcessingResponse(request_trailers=ext_pb.TrailersResponse())
    if phase == "response_trailers":
        return ext_pb.ProcessingResponse(response_trailers=ext_pb.TrailersResponse())
    return None


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
        stream = StreamProcessor(self._gateway, tracer, None if tracer is None else
                                 dict(context.invocation_metadata() or ()).get("traceparent"))
        try:
            while True:
                message = await context.read()
                if message is EOF:
                    return
                phase = message.WhichOneof("request")
                started = cpu()
                used = 0.0
                try:
                    response = stream.handle(message, phase)
                    while not isinstance(response, ext_pb.ProcessingResponse | None):
                        used += cpu() - started
                        if isinstance(response, AdmitRequest):
                            # One store round trip, bounded by its deadline.
                            answer: AdmitResult | Rejected | None = await self._store.admit(response)
                        else:
                            # The pool is saturated: hold the reply (Envoy's timer extended to the class's wait).
                            await context.write(protocol.extend_message_timeout(response.deadline - time.monotonic()))
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
