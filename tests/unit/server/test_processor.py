"""The ext_proc servicer driven message by message through a fake gRPC context (no network)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_pb
from grpc.aio import EOF  # type: ignore[attr-defined]
from prometheus_client import CollectorRegistry

from extproc.config import parse_policy
from extproc.endpoints import EndpointRegistry
from extproc.gateway import Route, RuntimeHolder, build_gateway
from extproc.limits.memory import MemoryStore
from extproc.limits.types import AdmitRequest, ConcurrencyLimit, TokenBudget
from extproc.openai.apis import RATELIMIT_HEADERS
from extproc.server import protocol
from extproc.server.processor import ExternalProcessorService
from extproc.server.protocol import request_head
from extproc.telemetry import GatewayMetrics

POLICY = """\
tiers:
  default: {limits: {concurrency: 1, tokens_per_min: 100000}}
pools:
  - name: chat
    model: org/chat
    aliases: [chat]
    endpoints: ["10.0.0.1:8000", "10.0.0.2:8000"]
"""


class FakeContext:
    def __init__(self, messages: list[ext_pb.ProcessingRequest]) -> None:
        self.inbox = list(messages)
        self.written: list[ext_pb.ProcessingResponse] = []

    async def read(self) -> Any:
        return self.inbox.pop(0) if self.inbox else EOF

    async def write(self, message: ext_pb.ProcessingResponse) -> None:
        self.written.append(message)


def headers_message(pairs: dict[str, str], end_of_stream: bool = False) -> ext_pb.ProcessingRequest:
    values = [base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
    return ext_pb.ProcessingRequest(request_headers=ext_pb.HttpHeaders(
        headers=base_pb2.HeaderMap(headers=values), end_of_stream=end_of_stream))


def body_message(body: bytes) -> ext_pb.ProcessingRequest:
    return ext_pb.ProcessingRequest(request_body=ext_pb.HttpBody(body=body, end_of_stream=True))


def status_message(code: int) -> ext_pb.ProcessingRequest:
    return ext_pb.ProcessingRequest(response_headers=ext_pb.HttpHeaders(headers=base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=":status", raw_value=str(code).encode())])))


def make(policy: str = POLICY) -> tuple[ExternalProcessorService, EndpointRegistry, MemoryStore]:
    runtimes = RuntimeHolder(parse_policy(policy))
    gateway = build_gateway(runtimes, GatewayMetrics(CollectorRegistry())).gateway
    store = MemoryStore()
    return ExternalProcessorService(gateway, store), runtimes.registry, store


def in_flight(registry: EndpointRegistry) -> int:
    return sum(e.in_flight for e in registry.endpoints())


def set_headers(mutation: ext_pb.HeaderMutation) -> dict[str, str]:
    return {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}


CHAT = json.dumps({"model": "chat", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5}).encode()
HEAD = {":method": "POST", ":path": "/v1/chat/completions", "x-request-id": "r1"}


async def run(service: ExternalProcessorService, messages: list[ext_pb.ProcessingRequest]) -> FakeContext:
    context = FakeContext(messages)
    await service.Process(None, context)  # type: ignore[arg-type]
    return context


async def test_full_exchange_routes_rewrites_and_carries_ratelimit_headers_in_metadata() -> None:
    service, registry, _ = make()
    context = await run(service, [headers_message(HEAD), body_message(CHAT)])
    first, second = context.written
    assert first.WhichOneof("response") == "request_headers"
    # A limited tenant's headers reply asks for nothing more of the response (no mode override): Envoy adds the
    # rate-limit headers from the route's metadata itself.
    assert not first.HasField("mode_override")
    common = second.request_body.response
    assert common.clear_route_cache
    headers = set_headers(common.header_mutation)
    assert headers["x-gateway-pool"] == "chat"
    assert headers["x-gateway-destination-endpoint"].split(",")[0] in {"10.0.0.1:8000", "10.0.0.2:8000"}
    assert json.loads(common.body_mutation.body)["model"] == "org/chat"
    assert headers["content-length"] == str(len(common.body_mutation.body))
    metadata = second.dynamic_metadata.fields["extproc"].struct_value.fields
    assert metadata["tenant"].string_value == "anonymous" and metadata["reservation"].string_value
    assert metadata["x-ratelimit-limit-tokens"].string_value == "100000"
    assert 0 < int(metadata["x-ratelimit-remaining-tokens"].string_value) < 100000  # after this reservation
    assert metadata["x-ratelimit-reset-tokens"].string_value
    assert "x-ratelimit-limit-requests" not in metadata  # no request-rate limit: no such header
    assert not any(key.startswith("anthropic-") for key in metadata)  # Anthropic's names on /v1/messages only
    assert in_flight(registry) == 0  # the stream ended: lease released


async def test_ratelimit_metadata_only_for_limited_tenants_and_never_from_the_client() -> None:
    """A tenant without limits gets no rate-limit keys (Envoy then adds no header), whatever the client sends
    as headers or in its body; the Messages API gets Anthropic's names too, the same numbers."""
    forged = {name: "999999" for name in RATELIMIT_HEADERS}
    service, _, _ = make(POLICY.replace("tiers:\n  default: {limits: {concurrency: 1, tokens_per_min: 100000}}\n",
                                        ""))
    context = await run(service, [headers_message({**HEAD, **forged}), body_message(CHAT)])
    first, second = context.written
    assert not first.HasField("mode_override")
    metadata = second.dynamic_metadata.fields["extproc"].struct_value.fields
    assert metadata["tenant"].string_value == "anonymous"
    assert not set(metadata) & set(RATELIMIT_HEADERS)
    service, _, _ = make()
    messages = json.dumps({"model": "chat", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                           "metadata": forged}).encode()
    context = await run(service, [headers_message({**HEAD, ":path": "/v1/messages", **forged}),
                                  body_message(messages)])
    metadata = context.written[1].dynamic_metadata.fields["extproc"].struct_value.fields
    remaining = metadata["x-ratelimit-remaining-tokens"].string_value
    assert remaining != "999999" and metadata["anthropic-ratelimit-tokens-remaining"].string_value == remaining
    assert metadata["anthropic-ratelimit-tokens-limit"].string_value == "100000"


async def test_concurrency_lease_is_held_for_the_stream_and_released_after() -> None:
    service, _, store = make()
    # One stream still open (no EOF yet) holds the only concurrency slot ...
    gateway = service._gateway
    exchange, _ = gateway.headers(request_head(headers_message(HEAD).request_headers))
    phase = gateway.body(exchange, CHAT)
    admission = next(phase)
    assert isinstance(admission, AdmitRequest)
    result = await store.admit(admission)
    assert result.admitted
    with pytest.raises(StopIteration) as done:
        phase.send(result)
    assert isinstance(done.value.value, Route) and done.value.value.pool == "chat"
    # ... so a second exchange is refused with 429 and OpenAI-style headers, at its headers (this process holds
    # the tenant's only lease: no body is parsed).
    context = await run(service, [headers_message({**HEAD, "x-request-id": "r2"})])
    refused = context.written[0].immediate_response
    assert refused.status.code == 429
    assert json.loads(refused.body)["error"]["code"] == "rate_limit_exceeded"
    assert "retry-after" in set_headers(refused.headers)
    # Releasing the first frees the slot for the next request.
    held = gateway.finish(exchange)
    assert held is not None
    await store.release(held, 0.0)
    context = await run(service, [headers_message({**HEAD, "x-request-id": "r3"}), body_message(CHAT)])
    assert context.written[1].WhichOneof("response") == "request_body"


async def test_error_becomes_immediate_response_with_openai_body() -> None:
    service, registry, _ = make()
    context = await run(service, [headers_message({":method": "POST", ":path": "/v1/completions"}),
                                  body_message(b'{"model": "missing", "prompt": "x"}')])
    immediate = context.written[1].immediate_response
    assert immediate.status.code == 404
    assert json.loads(immediate.body)["error"]["code"] == "model_not_found"
    assert set_headers(immediate.headers)["content-type"] == "application/json"
    assert in_flight(registry) == 0


async def test_body_without_headers_and_unrequested_phases_are_answered() -> None:
    service, _, _ = make()
    context = await run(service, [body_message(b"{}"),
                                  ext_pb.ProcessingRequest(response_trailers=ext_pb.HttpTrailers())])
    assert context.written[0].immediate_response.status.code == 400
    assert context.written[1].WhichOneof("response") == "response_trailers"


class TokenContext(FakeContext):
    """A fake context with call metadata; abort() raises like grpc.aio's."""

    def __init__(self, messages: list[ext_pb.ProcessingRequest], metadata: tuple[tuple[str, str], ...]) -> None:
        super().__init__(messages)
        self.metadata = metadata
        self.aborted: grpc.StatusCode | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = code
        raise grpc.aio.AbortError()


async def test_streams_without_the_grpc_token_are_refused_before_any_message() -> None:
    metrics = GatewayMetrics(CollectorRegistry())
    gateway = build_gateway(RuntimeHolder(parse_policy(POLICY)), metrics).gateway
    service = ExternalProcessorService(gateway, MemoryStore(), token="t0k3n", metrics=metrics)
    for metadata in ((), (("x-extproc-token", "wrong"),)):
        context = TokenContext([headers_message(HEAD), body_message(CHAT)], metadata)
        with pytest.raises(grpc.aio.AbortError):
            await service.Process(None, context)  # type: ignore[arg-type]
        assert context.aborted == grpc.StatusCode.UNAUTHENTICATED and context.written == []
    good = TokenContext([headers_message(HEAD), body_message(CHAT)], (("x-extproc-token", "t0k3n"),))
    await service.Process(None, good)  # type: ignore[arg-type]
    assert good.written[1].WhichOneof("response") == "request_body"
    assert metrics.refused_streams.labels("ext_proc")._value.get() == 2


async def test_an_internal_error_answers_500_and_gives_everything_back(monkeypatch: pytest.MonkeyPatch) -> None:
    service, registry, store = make()

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    # Fails after the decision was made (lease taken, budget reserved): the reply never reached Envoy.
    monkeypatch.setattr(protocol, "route_response", broken)
    context = await run(service, [headers_message(HEAD), body_message(CHAT)])
    assert context.written[1].immediate_response.status.code == 500
    assert in_flight(registry) == 0
    # Nothing is held: the one concurrency slot is free and the budget was settled to 0.
    probe = await store.admit(AdmitRequest("probe", time.time(), 0,
                                           concurrency=(ConcurrencyLimit("{anonymous}:all:cc", 1),),
                                           budgets=(TokenBudget("{anonymous}:all:tpm", 100000, 60),)))
    assert probe.admitted
    assert next(s for s in probe.states if s.name == "tokens").remaining == 100000


async def test_an_error_after_the_exchange_was_served_leaves_its_charge_to_the_access_log(
        monkeypatch: pytest.MonkeyPatch) -> None:
    service, _, store = make()

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug in the response phase")

    monkeypatch.setattr(protocol, "response_headers_response", broken)
    await run(service, [headers_message(HEAD), body_message(CHAT), status_message(200)])
    probe = await store.admit(AdmitRequest("probe", time.time(), 0,
                                           budgets=(TokenBudget("{anonymous}:all:tpm", 100000, 60),)))
    # Still reserved (the model did answer): the access log's usage settles it, not a charge of 0 now.
    assert next(s for s in probe.states if s.name == "tokens").remaining < 100000


async def test_scores_are_recorded_only_for_a_sampled_exchange() -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from extproc.server.processor import StreamProcessor
    from extproc.telemetry.tracing import DecisionTracer
    from extproc.telemetry.tracing_config import TracingConfig

    exporter = InMemorySpanExporter()
    tracer = DecisionTracer(TracingConfig(enabled=True, sample_ratio=0.0), exporter=exporter)
    service, _, _ = make(POLICY[POLICY.index("pools:"):])  # no limits: the body phase decides at once
    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-"
    for flags, sampled in (("00", False), ("01", True)):
        stream = StreamProcessor(service._gateway, tracer, (("traceparent", trace + flags),))
        stream.handle(headers_message(HEAD), "request_headers")
        assert stream.exchange is not None
        assert (stream.span is not None, stream.exchange.scores is not None) == (sampled, sampled)
        reply = stream.handle(body_message(CHAT), "request_body")
        assert isinstance(reply, ext_pb.ProcessingResponse)
        headers = set_headers(reply.request_body.response.header_mutation)
        assert ("traceparent" in headers) == sampled
        if sampled:
            scores = stream.exchange.scores
            assert scores is not None and set(scores.totals) == {"10.0.0.1:8000", "10.0.0.2:8000"}
        stream.end_span(time.monotonic())
    tracer.shutdown()
    (span,) = exporter.get_finished_spans()  # the sampled one only
    attributes = dict(span.attributes or {})
    assert attributes["extproc.scored_endpoints"] == 2
    assert any(key.startswith("extproc.score.") for key in attributes)


class Logged(FakeContext):
    """A stream whose replies go to a log shared with other streams, named: the order they were decided in."""

    def __init__(self, name: str, messages: list[ext_pb.ProcessingRequest], log: list[str]) -> None:
        super().__init__(messages)
        self.name, self.log = name, log

    async def write(self, message: ext_pb.ProcessingResponse) -> None:
        await super().write(message)
        self.log.append(f"{self.name} {message.WhichOneof('response')}")


async def test_large_bodies_are_decided_one_at_a_time_after_the_small_messages_waiting() -> None:
    # Decoding a body of megabytes holds the loop for tens of ms (~100 ms on a third of a core): eight of them in a
    # row kept another tenant's message past Envoy's message_timeout. A small exchange that arrives with them is
    # decided first, and the large ones in their order.
    service, registry, _ = make("pools:" + POLICY.split("pools:")[1])  # no limits
    large = json.dumps({"model": "chat", "messages": [{"role": "user", "content": "x" * 300_000}],
                        "max_tokens": 5}).encode()
    log: list[str] = []
    streams = [Logged("large-1", [headers_message(HEAD), body_message(large)], log),
               Logged("large-2", [headers_message(HEAD), body_message(large)], log),
               Logged("small", [headers_message(HEAD), body_message(CHAT)], log)]
    await asyncio.gather(*(service.Process(None, s) for s in streams))  # type: ignore[arg-type]
    bodies = [entry.split()[0] for entry in log if entry.endswith("request_body")]
    assert bodies == ["small", "large-1", "large-2"], log
    assert all(s.written[-1].request_body.response.header_mutation.set_headers for s in streams)  # all routed
    assert in_flight(registry) == 0
