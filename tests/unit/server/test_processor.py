from __future__ import annotations

import json

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_pb
from prometheus_client import CollectorRegistry

from extproc.config import parse_policy
from extproc.endpoints import EndpointRegistry
from extproc.gateway import Gateway, SnapshotHolder
from extproc.server.processor import StreamProcessor
from extproc.telemetry import GatewayMetrics

POLICY = """\
pools:
  - name: chat
    model: org/chat
    aliases: [chat]
    endpoints: ["10.0.0.1:8000", "10.0.0.2:8000"]
"""


def headers_message(pairs: dict[str, str], end_of_stream: bool = False) -> ext_pb.ProcessingRequest:
    values = [base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
    return ext_pb.ProcessingRequest(request_headers=ext_pb.HttpHeaders(
        headers=base_pb2.HeaderMap(headers=values), end_of_stream=end_of_stream))


def body_message(body: bytes) -> ext_pb.ProcessingRequest:
    return ext_pb.ProcessingRequest(request_body=ext_pb.HttpBody(body=body, end_of_stream=True))


def make() -> tuple[StreamProcessor, EndpointRegistry]:
    registry = EndpointRegistry()
    gateway = Gateway(SnapshotHolder(parse_policy(POLICY)), registry, GatewayMetrics(CollectorRegistry()))
    return StreamProcessor(gateway), registry


def set_headers(common: ext_pb.CommonResponse) -> dict[str, str]:
    return {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers}


def test_full_exchange_sets_headers_rewrites_body_and_releases() -> None:
    processor, registry = make()
    first = processor.handle(headers_message({":method": "POST", ":path": "/v1/chat/completions"}))
    assert first is not None and first.WhichOneof("response") == "request_headers"
    body = json.dumps({"model": "chat", "messages": [{"role": "user", "content": "x"}]}).encode()
    second = processor.handle(body_message(body))
    assert second is not None and second.WhichOneof("response") == "request_body"
    common = second.request_body.response
    assert common.clear_route_cache
    headers = set_headers(common)
    assert headers["x-gateway-pool"] == "chat"
    assert headers["x-gateway-destination-endpoint"].split(",")[0] in {"10.0.0.1:8000", "10.0.0.2:8000"}
    assert json.loads(common.body_mutation.body)["model"] == "org/chat"
    assert headers["content-length"] == str(len(common.body_mutation.body))
    assert registry.total_in_flight() == 1
    status = ext_pb.ProcessingRequest(response_headers=ext_pb.HttpHeaders(headers=base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=":status", raw_value=b"200")])))
    third = processor.handle(status)
    assert third is not None and third.WhichOneof("response") == "response_headers"
    processor.close()
    assert registry.total_in_flight() == 0


def test_error_becomes_immediate_response_with_openai_body() -> None:
    processor, registry = make()
    processor.handle(headers_message({":method": "POST", ":path": "/v1/completions"}))
    reply = processor.handle(body_message(b'{"model": "missing", "prompt": "x"}'))
    assert reply is not None and reply.WhichOneof("response") == "immediate_response"
    immediate = reply.immediate_response
    assert immediate.status.code == 404
    assert json.loads(immediate.body)["error"]["code"] == "model_not_found"
    content_type = {h.header.key: h.header.raw_value for h in immediate.headers.set_headers}["content-type"]
    assert content_type == b"application/json"
    processor.close()
    assert registry.total_in_flight() == 0


def test_body_without_headers_and_unrequested_phases_are_answered() -> None:
    processor, _ = make()
    reply = processor.handle(body_message(b"{}"))
    assert reply is not None and reply.immediate_response.status.code == 400
    trailers = processor.handle(ext_pb.ProcessingRequest(response_trailers=ext_pb.HttpTrailers()))
    assert trailers is not None and trailers.WhichOneof("response") == "response_trailers"
    processor.close()  # no exchange: nothing to release, must not raise
