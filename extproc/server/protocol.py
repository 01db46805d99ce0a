"""Translate between Envoy ext_proc protobufs and the pipeline's plain dataclasses.

The only module (with `processor.py`) that touches Envoy protos.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import duration_pb2, struct_pb2

from extproc.flow.config import MESSAGE_TIMEOUT_SLACK_S
from extproc.gateway import RequestHead, Respond, Route

_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD

CONTINUE_REQUEST_HEADERS = ext_pb.ProcessingResponse(request_headers=ext_pb.HeadersResponse())
CONTINUE_RESPONSE_HEADERS = ext_pb.ProcessingResponse(response_headers=ext_pb.HeadersResponse())
CONTINUE_REQUEST_BODY = ext_pb.ProcessingResponse(request_body=ext_pb.BodyResponse())
CLEAR_REQUEST_BODY = ext_pb.ProcessingResponse(request_body=ext_pb.BodyResponse(response=ext_pb.CommonResponse(
    body_mutation=ext_pb.BodyMutation(clear_body=True))))


def header_map(headers: ext_pb.HttpHeaders) -> dict[str, str]:
    """Envoy sends lowercase keys, values in raw_value (bytes); repeated keys are comma-joined."""
    result: dict[str, str] = {}
    for item in headers.headers.headers:
        value = item.raw_value.decode("latin-1") if item.raw_value else item.value
        key = item.key
        result[key] = f"{result[key]},{value}" if key in result else value
    return result


def request_head(headers: ext_pb.HttpHeaders, subset: tuple[str, ...] | None = None) -> RequestHead:
    values = header_map(headers)
    return RequestHead(
        method=values.get(":method", ""),
        path=values.get(":path", ""),
        headers=values,
        end_of_stream=headers.end_of_stream,
        subset=subset,
    )


def response_status(headers: ext_pb.HttpHeaders) -> int:
    for item in headers.headers.headers:
        if item.key == ":status":
            raw = item.raw_value or item.value.encode()
            return int(raw) if raw.isdigit() else 0
    return 0


def _set_headers(pairs: tuple[tuple[str, str], ...]) -> list[base_pb2.HeaderValueOption]:
    return [
        base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(key=key, raw_value=value.encode("latin-1")), append_action=_OVERWRITE
        )
        for key, value in pairs
    ]


METADATA_NAMESPACE = "extproc"


def _set_metadata(response: ext_pb.ProcessingResponse, fields: Mapping[str, Any]) -> None:
    """Our namespace's fields (strings and numbers; anything else as its str) set in place: Struct.update's
    generic conversion costs ~4x as much per field."""
    namespace = response.dynamic_metadata.fields[METADATA_NAMESPACE].struct_value.fields
    for key, value in fields.items():
        if isinstance(value, str):
            namespace[key].string_value = value
        elif isinstance(value, bool):
            namespace[key].bool_value = value
        elif isinstance(value, int | float):
            namespace[key].number_value = value
        elif value is None:
            namespace[key].null_value = struct_pb2.NULL_VALUE
        else:
            namespace[key].string_value = str(value)


# Where the endpoint-picker protocol wants the pick besides the header: (metadata namespace, key).
PickKey: TypeAlias = tuple[str, str]


def _set_route_metadata(response: ext_pb.ProcessingResponse, route: Route, pick: PickKey | None) -> None:
    if route.metadata:
        _set_metadata(response, route.metadata)
    if pick is not None:  # the endpoint-picker protocol: the pick (and its fallbacks) as one comma-separated string
        namespace, key = pick
        response.dynamic_metadata.fields[namespace].struct_value.fields[key].string_value = ",".join(route.endpoints)


def route_response(route: Route, pick: PickKey | None = None) -> ext_pb.ProcessingResponse:
    common = ext_pb.CommonResponse(
        header_mutation=ext_pb.HeaderMutation(set_headers=_set_headers(route.set_headers)),
        clear_route_cache=True,
    )
    if route.body is not None:
        common.body_mutation.body = route.body
    response = ext_pb.ProcessingResponse(request_body=ext_pb.BodyResponse(response=common))
    _set_route_metadata(response, route, pick)
    return response


def response_headers_response(add: tuple[tuple[str, str], ...]) -> ext_pb.ProcessingResponse:
    if not add:
        return CONTINUE_RESPONSE_HEADERS
    common = ext_pb.CommonResponse(header_mutation=ext_pb.HeaderMutation(set_headers=_set_headers(add)))
    return ext_pb.ProcessingResponse(response_headers=ext_pb.HeadersResponse(response=common))


def immediate_response(reply: Respond) -> ext_pb.ProcessingResponse:
    response = ext_pb.ProcessingResponse(
        immediate_response=ext_pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=reply.status),
            headers=ext_pb.HeaderMutation(set_headers=_set_headers(reply.headers)),
            body=reply.body,
            details=reply.details,
        )
    )
    if reply.metadata:
        _set_metadata(response, reply.metadata)
    return response


def extend_message_timeout(remaining_s: float) -> ext_pb.ProcessingResponse:
    """Tell Envoy to wait `remaining_s` (+ slack) for our answer to the current message: sent when a
    request is queued. Envoy honours it up to the filter's `max_message_timeout`."""
    duration = duration_pb2.Duration()
    duration.FromMilliseconds(int((max(0.0, remaining_s) + MESSAGE_TIMEOUT_SLACK_S) * 1000))
    return ext_pb.ProcessingResponse(override_message_timeout=duration)


# Request/response body modes as Envoy announces them in the stream's first message (`protocol_config`).
STREAMED = processing_mode_pb2.ProcessingMode.STREAMED
FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
CONTINUE_RESPONSE_BODY = ext_pb.ProcessingResponse(response_body=ext_pb.BodyResponse())
CONTINUE_REQUEST_TRAILERS = ext_pb.ProcessingResponse(request_trailers=ext_pb.TrailersResponse())
# A streamed body goes back to Envoy in pieces of at most this size (well under gRPC's message limits).
STREAMED_PIECE = 64 * 1024


def _strings(value: struct_pb2.Value) -> list[str]:
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return [value.string_value]
    if kind == "list_value":
        return [item.string_value for item in value.list_value.values if item.WhichOneof("kind") == "string_value"]
    return []


def metadata_value(context: base_pb2.Metadata, namespace: str, key: str) -> list[str] | None:
    """The strings Envoy forwarded under `namespace`/`key` of the stream's metadata (None: key absent). A string
    may hold a comma-separated list; a list value is a list of such strings."""
    fields = context.filter_metadata.get(namespace)
    if fields is None or key not in fields.fields:
        return None
    return [part.strip() for text in _strings(fields.fields[key]) for part in text.split(",") if part.strip()]


def held_headers_response(route: Route, pick: PickKey | None) -> ext_pb.ProcessingResponse:
    """The reply to request headers held until the decision (streamed bodies): the pick's header mutations."""
    common = ext_pb.CommonResponse(
        header_mutation=ext_pb.HeaderMutation(set_headers=_set_headers(route.set_headers)),
        clear_route_cache=True,
    )
    response = ext_pb.ProcessingResponse(request_headers=ext_pb.HeadersResponse(response=common))
    _set_route_metadata(response, route, pick)
    return response


def replacing_headers_response(route: Route, pick: PickKey | None, body: bytes) -> ext_pb.ProcessingResponse:
    """The held headers reply that also replaces the whole request body (CONTINUE_AND_REPLACE: Envoy sends no
    later body chunk upstream)."""
    response = held_headers_response(route, pick)
    common = response.request_headers.response
    common.status = ext_pb.CommonResponse.CONTINUE_AND_REPLACE
    common.body_mutation.body = body
    return response


def streamed_request_body(body: bytes, end_of_stream: bool = True) -> list[ext_pb.ProcessingResponse]:
    """FULL_DUPLEX_STREAMED: the request body Envoy sends upstream, in pieces (Envoy holds what it sent us)."""
    pieces = [body[at:at + STREAMED_PIECE] for at in range(0, len(body), STREAMED_PIECE)] or [b""]
    last = len(pieces) - 1
    return [ext_pb.ProcessingResponse(request_body=ext_pb.BodyResponse(response=ext_pb.CommonResponse(
        body_mutation=ext_pb.BodyMutation(streamed_response=ext_pb.StreamedBodyResponse(
            body=piece, end_of_stream=end_of_stream and index == last)))))
        for index, piece in enumerate(pieces)]


def streamed_chunk_replies(count: int, new_body: bytes | None) -> list[ext_pb.ProcessingResponse]:
    """STREAMED: one reply per body message Envoy sent, in order; a new body replaces the first chunk and
    clears the others."""
    if new_body is None:
        return [CONTINUE_REQUEST_BODY] * count
    first = ext_pb.ProcessingResponse(request_body=ext_pb.BodyResponse(response=ext_pb.CommonResponse(
        body_mutation=ext_pb.BodyMutation(body=new_body))))
    return [first] + [CLEAR_REQUEST_BODY] * (count - 1)


def streamed_response_body(body: bytes, end_of_stream: bool) -> ext_pb.ProcessingResponse:
    """FULL_DUPLEX_STREAMED response chunks go back untouched (no parsing: one message built per chunk)."""
    return ext_pb.ProcessingResponse(response_body=ext_pb.BodyResponse(response=ext_pb.CommonResponse(
        body_mutation=ext_pb.BodyMutation(streamed_response=ext_pb.StreamedBodyResponse(
            body=body, end_of_stream=end_of_stream)))))
