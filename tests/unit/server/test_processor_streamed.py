"""Policy mode with a STREAMED request body sent without waiting for the headers reply (`envoy.request_body_mode:
streamed`): the decision on the declared length, the replies owed to chunks after it, the end of the stream after
an immediate answer, and the upload nudge (driven message by message, no network)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_pb

from extproc.server.processor import StreamProcessor
from tests.unit.server.test_processor import CHAT, HEAD, POLICY, FakeContext, in_flight, make
from tests.unit.server.test_processor_modes import Mode, chunk, headers

SERVED_NAME = json.dumps({"model": "org/chat", "messages": [{"role": "user", "content": "x"}],
                          "max_tokens": 5}).encode()


def streamed(body: bytes, **head: str) -> ext_pb.ProcessingRequest:
    return headers(Mode.STREAMED, without_waiting=True,
                   head={**HEAD, "content-length": str(len(body)), **head})


def kinds(written: list[ext_pb.ProcessingResponse]) -> list[str | None]:
    return [r.WhichOneof("response") or ("override_message_timeout" if r.HasField("override_message_timeout")
                                         else None) for r in written]


class Recording(FakeContext):
    """Envoy's side: the replies in order, and how many messages the service read before it ended the stream."""

    def __init__(self, messages: list[ext_pb.ProcessingRequest]) -> None:
        super().__init__(messages)
        self.reads = 0

    async def read(self) -> Any:
        self.reads += 1
        return await super().read()


STREAMED = POLICY + "envoy: {request_body_mode: streamed}\n"  # (the default, prebuffered, decides on one chunk)


async def run(messages: list[ext_pb.ProcessingRequest], policy: str = STREAMED) -> tuple[Recording, Any]:
    service, registry, _ = make(policy)
    context = Recording(messages)
    await service.Process(None, context)  # type: ignore[arg-type]
    return context, registry


async def test_the_declared_length_decides_before_envoy_s_empty_end_of_stream_chunk() -> None:
    # Envoy's HTTP/1 codec sends the data, then an empty chunk ending the stream: the routing answer must not wait
    # for it, and the empty chunk still gets its own reply, in order.
    context, _ = await run([streamed(SERVED_NAME), chunk(SERVED_NAME, False), chunk(b"", True)])
    assert kinds(context.written) == ["request_headers", "request_body", "request_body"]
    routing = context.written[0].request_headers.response
    assert routing.clear_route_cache and routing.header_mutation.set_headers
    assert not context.written[1].request_body.response.HasField("body_mutation")  # nothing to rewrite
    assert context.written[2] == ext_pb.ProcessingResponse(request_body=ext_pb.BodyResponse())


async def test_a_rewritten_body_replaces_the_first_chunk_and_clears_what_follows() -> None:
    context, _ = await run([streamed(CHAT), chunk(CHAT, False), chunk(b"", True)])
    assert kinds(context.written) == ["request_headers", "request_body", "request_body"]
    assert json.loads(context.written[1].request_body.response.body_mutation.body)["model"] == "org/chat"
    assert context.written[2].request_body.response.body_mutation.clear_body


async def test_without_a_declared_length_the_decision_waits_for_the_end_of_the_stream() -> None:
    head = headers(Mode.STREAMED, without_waiting=True)
    half = len(SERVED_NAME) // 2
    context, _ = await run([head, chunk(SERVED_NAME[:half], False), chunk(SERVED_NAME[half:], True)])
    assert kinds(context.written) == ["request_headers", "request_body", "request_body"]
    assert context.written[0].request_headers.response.clear_route_cache


async def test_a_declared_length_that_lies_short_is_not_parsed_as_complete() -> None:
    # content-length smaller than what arrives: the first chunk exceeds it, so the decision waits for the end.
    context, _ = await run([streamed(b"{}"), chunk(SERVED_NAME, False), chunk(b"", True)])
    assert kinds(context.written) == ["request_headers", "request_body", "request_body"]
    assert context.written[0].request_headers.response.clear_route_cache


async def test_an_immediate_answer_ends_the_stream_without_reading_the_rest_of_the_body() -> None:
    # A hostile body keeps coming after the refusal: the service stops reading it (and pays nothing for it).
    policy = STREAMED + "bounds: {max_body_bytes: 2048}\n"
    big = b"x" * 1500
    messages = [headers(Mode.STREAMED, without_waiting=True), *(chunk(big, False) for _ in range(50)),
                chunk(b"", True)]
    context, registry = await run(messages, policy)
    assert kinds(context.written) == ["immediate_response"]
    assert context.written[0].immediate_response.status.code == 413
    assert context.reads == 3 and in_flight(registry) == 0  # headers, two chunks, then the stream ended
    declared, _ = await run([streamed(b"x" * 4096), chunk(b"x" * 1500, False)], policy)
    assert kinds(declared.written) == ["immediate_response"] and declared.reads == 1  # refused at the headers


class Paused(Recording):
    """A client that stops uploading after its headers: the next chunk comes only once the service asked Envoy
    for more time, or never (the test fails on its own bound)."""

    def __init__(self, messages: list[ext_pb.ProcessingRequest]) -> None:
        super().__init__(messages)
        self.nudged = asyncio.Event()

    async def read(self) -> Any:
        if self.reads == 1:
            await asyncio.wait_for(self.nudged.wait(), 5.0)
        return await super().read()

    async def write(self, message: ext_pb.ProcessingResponse) -> None:
        await super().write(message)
        if message.HasField("override_message_timeout"):
            self.nudged.set()


async def test_a_client_pausing_mid_upload_gets_envoy_s_timer_extended_not_a_failure() -> None:
    policy = POLICY + "envoy: {message_timeout_ms: 20, request_timeout_s: 45, request_body_mode: streamed}\n"
    service, _, _ = make(policy)
    context = Paused([streamed(SERVED_NAME), chunk(SERVED_NAME, False), chunk(b"", True)])
    await service.Process(None, context)  # type: ignore[arg-type]
    assert kinds(context.written) == ["override_message_timeout", "request_headers", "request_body", "request_body"]
    assert context.written[0].override_message_timeout.seconds >= 45  # up to the request timeout (Envoy caps it)


async def test_a_body_arriving_with_its_headers_is_never_nudged() -> None:
    policy = POLICY + "envoy: {message_timeout_ms: 10, request_body_mode: streamed}\n"
    context, _ = await run([streamed(SERVED_NAME), chunk(SERVED_NAME, False), chunk(b"", True)], policy)
    assert "override_message_timeout" not in kinds(context.written)


async def test_prebuffered_the_whole_body_follows_its_headers_in_one_chunk_one_reply_each() -> None:
    # Envoy's buffer filter ahead of ext_proc: the headers, then the whole body as one chunk ending the stream.
    policy = POLICY + "envoy: {request_body_mode: prebuffered}\n"
    context, _ = await run([streamed(SERVED_NAME), chunk(SERVED_NAME, True)], policy)
    assert kinds(context.written) == ["request_headers", "request_body"]
    held = context.written[0].request_headers.response
    assert held.clear_route_cache and held.status == ext_pb.CommonResponse.CONTINUE  # the body stays Envoy's
    assert context.written[1] == ext_pb.ProcessingResponse(request_body=ext_pb.BodyResponse())


def test_prebuffered_holds_the_headers_reply_but_never_waits_on_an_upload() -> None:
    """The client's upload ended before Envoy sent the headers: no timer to extend (streamed: there is)."""
    for mode, uploading in (("prebuffered", False), ("streamed", True)):
        service, _, _ = make(POLICY + f"envoy: {{request_body_mode: {mode}}}\n")
        stream = StreamProcessor(service._gateway)
        assert stream.handle(streamed(SERVED_NAME), "request_headers") is None  # held until the body is decided
        assert stream.uploading is uploading


async def test_prebuffered_decides_on_the_first_chunk_when_request_trailers_follow_it() -> None:
    # An HTTP/2 body without content-length ended by trailers: Envoy's buffer filter passes the whole body as one
    # chunk without end_of_stream and holds the trailers while the headers reply is outstanding.
    policy = POLICY + "envoy: {request_body_mode: prebuffered}\n"
    head = headers(Mode.STREAMED, without_waiting=True, head=HEAD)
    context, _ = await run([head, chunk(SERVED_NAME, False)], policy)
    assert kinds(context.written) == ["request_headers", "request_body"]
    # Envoy 1.40 would forward more than the answered chunk: the headers reply replaces the whole body instead
    replaced = context.written[0].request_headers.response
    assert replaced.status == ext_pb.CommonResponse.CONTINUE_AND_REPLACE and replaced.clear_route_cache
    assert replaced.body_mutation.body == SERVED_NAME
    assert context.written[1].request_body.response.body_mutation.clear_body
    streamed_context, _ = await run([head, chunk(SERVED_NAME, False)])  # streamed: waits for the body's end
    assert kinds(streamed_context.written) == []


async def test_prebuffered_never_decides_on_part_of_a_body() -> None:
    # A data plane without the buffer filter ahead of ext_proc (hand-written Envoy config) sends the body in pieces:
    # deciding on the first piece would judge a truncated prompt. Refused as a misconfiguration, nothing routed.
    policy = POLICY + "envoy: {request_body_mode: prebuffered}\n"
    context, _ = await run([streamed(SERVED_NAME), chunk(SERVED_NAME[:10], False), chunk(SERVED_NAME[10:], True)],
                           policy)
    assert kinds(context.written) == ["immediate_response"]
    assert context.written[0].immediate_response.status.code == 500
    assert b"buffer filter" in context.written[0].immediate_response.body
