"""The stream processor in every request body mode Envoy announces, and in endpoint-picker mode: the pick as header
and `envoy.lb` metadata, the subset hint, the served endpoint, 429 shedding (driven message by message, no
network)."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_pb
from google.protobuf import struct_pb2

from extproc.config.schema import SaturationConfig
from extproc.endpoints import EndpointRegistry
from extproc.endpoints.metrics import EndpointMetrics
from extproc.openai.apis import RATELIMIT_HEADERS
from extproc.server import protocol
from tests.unit.server.test_processor import CHAT, HEAD, FakeContext, in_flight, make, set_headers, status_message

Mode = processing_mode_pb2.ProcessingMode
EPP = """\
mode: endpoint-picker
pools:
  - name: chat
    model: org/chat
    aliases: [chat]
    endpoints: ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]
"""
DESTINATION = "x-gateway-destination-endpoint"
SERVED = "x-gateway-destination-endpoint-served"
MODEL = json.dumps({"model": "org/chat", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5}).encode()


def metadata(namespace: str, fields: dict[str, Any]) -> base_pb2.Metadata:
    value = struct_pb2.Struct()
    value.update(fields)
    result = base_pb2.Metadata()
    result.filter_metadata[namespace].CopyFrom(value)
    return result


def headers(mode: int = Mode.FULL_DUPLEX_STREAMED, *, without_waiting: bool = False,
            subset: Any = None, head: dict[str, str] | None = None) -> ext_pb.ProcessingRequest:
    values = [base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in (head or HEAD).items()]
    message = ext_pb.ProcessingRequest(
        request_headers=ext_pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=values)),
        protocol_config=ext_pb.ProtocolConfiguration(
            request_body_mode=mode, response_body_mode=mode,
            send_body_without_waiting_for_header_response=without_waiting))
    if subset is not None:
        message.metadata_context.CopyFrom(metadata("envoy.lb.subset_hint",
                                                   {"x-gateway-destination-endpoint-subset": subset}))
    return message


def chunk(body: bytes, end: bool) -> ext_pb.ProcessingRequest:
    return ext_pb.ProcessingRequest(request_body=ext_pb.HttpBody(body=body, end_of_stream=end))


def pieces(body: bytes, parts: int) -> list[ext_pb.ProcessingRequest]:
    size = -(-len(body) // parts)
    return [chunk(body[at:at + size], False) for at in range(0, len(body), size)] + [chunk(b"", True)]


def served(address: str, status: int = 200) -> ext_pb.ProcessingRequest:
    message = status_message(status)
    message.metadata_context.CopyFrom(metadata("envoy.lb", {SERVED: address, DESTINATION: "ignored"}))
    return message


async def run(messages: list[ext_pb.ProcessingRequest], policy: str = EPP
              ) -> tuple[list[ext_pb.ProcessingResponse], EndpointRegistry]:
    service, registry, _ = make(policy)
    context = FakeContext(messages)
    await service.Process(iter(()), context)  # type: ignore[arg-type]
    return context.written, registry


class OpenStream(FakeContext):
    """Envoy's side of a stream that stays open after its messages: `meanwhile` runs before the stream ends (the
    exchange is in flight), then the stream ends."""

    def __init__(self, messages: list[ext_pb.ProcessingRequest], meanwhile: Callable[[], Awaitable[None]]) -> None:
        super().__init__(messages)
        self.meanwhile = meanwhile

    async def read(self) -> Any:
        if not self.inbox:
            await self.meanwhile()
        return await super().read()


def pick(response: ext_pb.ProcessingResponse) -> tuple[str, str]:
    """The destination header and the envoy.lb metadata value of a routing reply."""
    common = getattr(response, response.WhichOneof("response")).response
    lb = response.dynamic_metadata.fields["envoy.lb"].struct_value.fields[DESTINATION].string_value
    return set_headers(common.header_mutation)[DESTINATION], lb


async def test_full_duplex_holds_the_headers_reply_until_the_whole_body_is_decided() -> None:
    written, _ = await run([headers(), *pieces(MODEL, 3)])
    assert [r.WhichOneof("response") for r in written] == ["request_headers", "request_body"]
    header, lb = pick(written[0])
    assert header == lb and header.split(",")[0] in {"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}
    assert len(header.split(",")) == 3  # primary + 2 fallbacks (the pool's default), same list in both places
    assert written[0].request_headers.response.clear_route_cache
    streamed = written[1].request_body.response.body_mutation.streamed_response
    assert (streamed.body, streamed.end_of_stream) == (MODEL, True)  # the body goes back as it came


async def test_full_duplex_gives_back_the_rewritten_body_in_pieces_with_its_length() -> None:
    big = json.dumps({"model": "chat", "messages": [{"role": "user", "content": "y" * 150_000}]}).encode()
    written, _ = await run([headers(), *pieces(big, 4)])
    assert written[0].WhichOneof("response") == "request_headers"
    bodies = [r.request_body.response.body_mutation.streamed_response for r in written[1:]]
    assert len(bodies) == 3 and [b.end_of_stream for b in bodies] == [False, False, True]
    sent = b"".join(b.body for b in bodies)
    assert json.loads(sent)["model"] == "org/chat"  # the alias rewritten to the served name
    assert set_headers(written[0].request_headers.response.header_mutation)["content-length"] == str(len(sent))


async def test_streamed_without_waiting_answers_every_chunk_after_the_held_headers() -> None:
    messages = [headers(Mode.STREAMED, without_waiting=True), *pieces(CHAT, 2)]
    written, _ = await run(messages)
    assert [r.WhichOneof("response") for r in written] == ["request_headers"] + ["request_body"] * 3
    first = written[1].request_body.response.body_mutation
    assert json.loads(first.body)["model"] == "org/chat"  # alias: the new body replaces the first chunk
    assert all(r.request_body.response.body_mutation.clear_body for r in written[2:])


async def test_streamed_while_envoy_waits_for_the_headers_reply_is_refused_not_misrouted() -> None:
    written, registry = await run([headers(Mode.STREAMED, without_waiting=False), *pieces(CHAT, 2)])
    assert len(written) == 1 and written[0].immediate_response.status.code == 500
    assert json.loads(written[0].immediate_response.body)["error"]["code"] == "gateway_error"
    assert in_flight(registry) == 0


async def test_buffered_answers_headers_at_once_and_routes_on_the_body_with_metadata() -> None:
    written, _ = await run([headers(Mode.BUFFERED), chunk(MODEL, True)])
    assert written[0] == protocol.CONTINUE_REQUEST_HEADERS
    header, lb = pick(written[1])
    assert header == lb
    assert "x-gateway-pool" not in set_headers(written[1].request_body.response.header_mutation)  # no pool header


async def test_an_envoy_that_announces_no_body_mode_is_served_as_buffered() -> None:
    head = headers(Mode.BUFFERED)
    head.ClearField("protocol_config")
    written, _ = await run([head, chunk(MODEL, True)])
    assert written[0] == protocol.CONTINUE_REQUEST_HEADERS
    assert pick(written[1])[0]


async def test_the_subset_hint_limits_the_pick_as_a_list_a_comma_string_or_bare_ips() -> None:
    for subset in (["10.0.0.2:8000"], "10.0.0.9:1, 10.0.0.2:8000", ["10.0.0.2"]):
        written, _ = await run([headers(subset=subset), chunk(MODEL, True)])
        assert pick(written[0]) == ("10.0.0.2:8000", "10.0.0.2:8000"), subset


async def test_the_subset_hint_limits_a_pool_larger_than_max_candidates() -> None:
    # Over scheduling.max_candidates the pool is scheduled over a sample: the sample is drawn from the hint.
    addresses = [f"10.0.1.{host}:8000" for host in range(1, 41)]
    policy = EPP.replace('["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]', json.dumps(addresses))
    policy += "scheduling:\n  max_candidates: 4\n"
    for index in range(6):
        subset = addresses[30 + index:32 + index]
        written, _ = await run([headers(subset=subset), chunk(MODEL, True)], policy)
        assert set(pick(written[0])[0].split(",")) == set(subset), subset


async def test_a_subset_with_no_eligible_endpoint_gets_503_and_takes_nothing() -> None:
    for subset in ([], ["10.9.9.9:8000"], "10.0.0.1:9999"):
        written, registry = await run([headers(subset=subset), chunk(MODEL, True)])
        assert written[0].immediate_response.status.code == 503, subset
        assert json.loads(written[0].immediate_response.body)["error"]["code"] == "no_capacity"
        assert in_flight(registry) == 0


async def test_single_endpoint_answers_one_address() -> None:
    policy = EPP + "endpoint_picker: {single_endpoint: true}\n"
    written, _ = await run([headers(), chunk(MODEL, True)], policy)
    header, lb = pick(written[0])
    assert header == lb and "," not in header


async def test_the_served_endpoint_moves_the_in_flight_count_and_feeds_passive_health() -> None:
    service, registry, _ = make(EPP + "health: {consecutive_failures: 1}\n")

    async def books() -> None:  # the exchange still runs: it counts where the data plane says it went
        counts = {e.address: e.in_flight for e in registry.endpoints()}
        assert counts == {"10.0.0.1:8000": 0, "10.0.0.2:8000": 0, "10.0.0.3:8000": 1}

    messages = [headers(subset=["10.0.0.1:8000"]), chunk(MODEL, True), served("10.0.0.3:8000", 503)]
    await service.Process(iter(()), OpenStream(messages, books))  # type: ignore[arg-type]
    assert in_flight(registry) == 0
    # The 503 from 10.0.0.3 opened its breaker: the next pick without a hint avoids it.
    runtime = service._gateway.runtimes.current
    health = service._gateway.stages.schedule.health
    usable = {e.address for e in health.usable(runtime.pools["chat"].endpoints, 1e12)}
    assert "10.0.0.3:8000" not in {e.address for e in health.usable(runtime.pools["chat"].endpoints, 0.0)}
    assert usable  # and comes back after its ejection


async def test_full_duplex_response_chunks_go_back_untouched() -> None:
    response_chunk = ext_pb.ProcessingRequest(response_body=ext_pb.HttpBody(body=b"data: {}\n\n", end_of_stream=False))
    last = ext_pb.ProcessingRequest(response_body=ext_pb.HttpBody(body=b"", end_of_stream=True))
    written, _ = await run([headers(), chunk(MODEL, True), status_message(200), response_chunk, last])
    echoed = [r.response_body.response.body_mutation.streamed_response for r in written[-2:]]
    assert [(e.body, e.end_of_stream) for e in echoed] == [(b"data: {}\n\n", False), (b"", True)]


async def test_a_streamed_body_past_the_limit_is_refused_413_at_once() -> None:
    policy = EPP + "bounds: {max_body_bytes: 2048}\n"
    big = b"x" * 1500
    written, registry = await run([headers(), chunk(big, False), chunk(big, False), chunk(big, True)], policy)
    assert len(written) == 1 and written[0].immediate_response.status.code == 413
    assert in_flight(registry) == 0


async def test_flow_control_sheds_with_429_in_endpoint_picker_mode_and_503_in_policy_mode() -> None:
    for mode, status in (("endpoint-picker", 429), ("policy", 503)):
        policy = f"""\
mode: {mode}
tiers: {{default: {{priority: sheddable}}}}
flow_control: {{classes: {{standard: {{priority: 50}}, sheddable: {{priority: 0, max_wait_s: 0}}}}}}
pools:
  - {{name: chat, model: org/chat, endpoints: ["10.0.0.1:8000"], max_num_seqs: 1}}
"""
        service, registry, _ = make(policy)
        endpoint = registry.endpoints()[0]  # an idle engine, freshly scraped: one seat (max_num_seqs)
        endpoint.scraped(EndpointMetrics(time.monotonic()), 0, SaturationConfig())
        second = FakeContext([headers(Mode.BUFFERED), chunk(MODEL, True)])
        # While the first request is in flight, the second one finds the pool full.
        first = OpenStream([headers(Mode.BUFFERED), chunk(MODEL, True)],
                           functools.partial(service.Process, iter(()), second))  # type: ignore[arg-type]
        await service.Process(iter(()), first)  # type: ignore[arg-type]
        refusal = second.written[-1].immediate_response
        assert refusal.status.code == status, mode
        assert json.loads(refusal.body)["error"]["code"] == "overloaded_saturated"
        assert in_flight(registry) == 0


async def test_hostile_bodies_in_full_duplex_get_their_error_and_leave_nothing_behind() -> None:
    for body, code in ((b'{"model": "org/chat", "messages": [', "invalid_json"), (b"", "invalid_json"),
                       (b'{"model": "nope", "messages": []}', "model_not_found")):
        written, registry = await run([headers(), *pieces(body, 2)] if body else [headers(), chunk(b"", True)])
        assert len(written) == 1, body
        assert json.loads(written[0].immediate_response.body)["error"]["code"] == code
        assert in_flight(registry) == 0


def test_explain_in_endpoint_picker_mode_shows_the_protocol_s_header() -> None:
    service, _, _ = make(EPP)
    head = protocol.request_head(headers().request_headers)
    explained = service._gateway.explain(head, MODEL)
    assert explained["decision"] == "route" and explained["pool"] == "chat"
    assert set(explained["set_headers"]) == {DESTINATION}
    assert explained["set_headers"][DESTINATION].split(",")[0] == explained["endpoints"][0]


async def test_endpoint_picker_mode_sends_ratelimit_headers_on_the_response_headers_it_receives() -> None:
    """The gateway's Envoy (not ours) sends the response headers in this mode and reads no `extproc` metadata: the
    rate-limit headers go in the reply to them, the same values, and none goes into metadata."""
    limited = EPP + "tiers:\n  default: {limits: {tokens_per_min: 5000}}\n"
    written, _ = await run([headers(Mode.BUFFERED), chunk(MODEL, True), served("10.0.0.1:8000")], limited)
    routed, answered = written[1], written[2]
    assert not set(routed.dynamic_metadata.fields["extproc"].struct_value.fields) & set(RATELIMIT_HEADERS)
    added = set_headers(answered.response_headers.response.header_mutation)
    assert added["x-ratelimit-limit-tokens"] == "5000"
    assert 0 < int(added["x-ratelimit-remaining-tokens"]) < 5000
