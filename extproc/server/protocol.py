"""Translate between Envoy ext_proc protobufs and the pipeline's plain dataclasses.

The only module (with `processor.py`) that touches Envoy protos.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import duration_pb2, struct_pb2

from extproc.flow.config import MESSAGE_TIMEOUT_SLACK_S
from extproc.gateway import RequestHead, Respond, Route

_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD

CONTINUE_REQUEST_HEADERS = ext_pb.ProcessingResponse(request_headers=ext_pb.HeadersResponse())
# The rendered processing mode with response headers turned on, for requests that get x-ratelimit-*.
CONTINUE_REQUEST_HEADERS_SEND_RESPONSE_HEADERS = ext_pb.ProcessingResponse(
    request_headers=ext_pb.HeadersResponse(),
    mode_override=processing_mode_pb2.ProcessingMode(
        request_header_mode=processing_mode_pb2.ProcessingMode.SEND,
        response_header_mode=processing_mode_pb2.ProcessingMode.SEND,
        request_body_mode=processing_mode_pb2.ProcessingMode.BUFFERED,
        response_body_mode=processing_mode_pb2.ProcessingMode.NONE,
        request_trailer_mode=processing_mode_pb2.ProcessingMode.SKIP,
        response_trailer_mode=processing_mode_pb2.ProcessingMode.SKIP,
    ),
)
CONTINUE_RESPONSE_HEADERS = ext_pb.ProcessingResponse(response_headers=ext_pb.HeadersResponse())
CONTINUE_REQUEST_BODY = ext_pb.ProcessingResponse(request_body=ext_pb.BodyResponse())


def header_map(headers: ext_pb.HttpHeaders) -> dict[str, str]:
    """Envoy sends lowercase keys, values in raw_value (bytes); repeated keys are comma-joined."""
    result: dict[str, str] = {}
    for item in headers.headers.headers:
        value = item.raw_value.decode("latin-1") if item.raw_value else item.value
        key = item.key
        result[key] = f"{result[key]},{value}" if key in result else value
    return result


def request_head(headers: ext_pb.HttpHeaders) -> RequestHead:
    values = header_map(headers)
    return RequestHead(
        method=values.get(":method", ""),
        path=values.get(":path", ""),
        headers=values,
        end_of_stream=headers.end_of_stream,
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


def route_response(route: Route) -> ext_pb.ProcessingResponse:
    common = ext_pb.CommonResponse(
        header_mutation=ext_pb.HeaderMutation(set_headers=_set_headers(route.set_headers)),
        clear_route_cache=True,
    )
    if route.body is not None:
        common.body_mutation.body = route.body
    response = ext_pb.ProcessingResponse(request_body=ext_pb.BodyResponse(response=common))
    if route.metadata:
        _set_metadata(response, route.metadata)
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
