"""Local replies: every error Envoy itself answers gets a body in the API's shape (extproc/xds/render.py):
Anthropic's on the Messages path, OpenAI's everywhere else."""

from __future__ import annotations

from typing import Any

from extproc.openai.errors import anthropic_type

__all__ = ["ANTHROPIC_PATH", "anthropic_error_format", "local_reply_config", "openai_error_format",
           "unrouted_response"]

ANTHROPIC_PATH = "/v1/messages"

# Local replies that Envoy itself generates (no upstream, upstream failed, body too large, ext_proc
# down) get an OpenAI-shaped body too. Replies our service sends are already JSON and are left alone.
# Mappers also see the replies our service sends through ext_proc, so each uses a fixed message
# that is right whoever produced the status.
_ENVOY_FAILURES: tuple[tuple[str, int | None, str, str, str], ...] = (
    ("UH", 503, "server_error", "no_healthy_upstream", "No healthy endpoint in the pool; retry later"),
    ("UF", 503, "server_error", "upstream_connect_failure", "Could not connect to the model server"),
    ("UO", 503, "server_error", "upstream_overflow", "The model pool is over capacity; retry later"),
    ("NC", 503, "server_error", "no_pool_selected", "No model pool was selected for this request"),
    ("NR", 404, "invalid_request_error", "no_route", "No route for this request"),
    ("UT", 504, "server_error", "upstream_timeout", "The model server did not answer in time"),
    ("URX", 503, "server_error", "upstream_retry_limit_exceeded", "The model server failed after retries"),
    ("UC", 503, "server_error", "upstream_connection_terminated", "The model server closed the connection"),
)
_BY_STATUS: tuple[tuple[int, int, str, str, str], ...] = (
    (408, 408, "invalid_request_error", "request_timeout", "The request was not received in time"),
    (413, 413, "invalid_request_error", "request_too_large", "Request body exceeds the gateway's size limit"),
    (500, 500, "server_error", "gateway_error", "The gateway could not process the request"),
    # ext_proc's message timeout answers 504 with an empty body (status_on_error covers only gRPC
    # errors); an upstream timeout also is 504 but carries the UT flag and was mapped above.
    (504, 500, "server_error", "gateway_error", "The gateway could not process the request"),
)


def openai_error_format(error_type: str, code: str, message: str) -> dict[str, Any]:
    return {
        "json_format": {"error": {"message": message, "type": error_type, "param": None, "code": code}},
        "content_type": "application/json",
    }


def anthropic_error_format(status: int, message: str) -> dict[str, Any]:
    return {
        "json_format": {"type": "error", "error": {"type": anthropic_type(status), "message": message}},
        "content_type": "application/json",
    }


def _on_anthropic_path(condition: dict[str, Any]) -> dict[str, Any]:
    path = {"header_filter": {"header": {"name": ":path", "string_match": {"prefix": ANTHROPIC_PATH}}}}
    return {"and_filter": {"filters": [condition, path]}}


def local_reply_config() -> dict[str, Any]:
    rows: list[tuple[dict[str, Any], int | None, int, str, str, str]] = [
        ({"response_flag_filter": {"flags": [flag]}}, status, status or 500, error_type, code, message)
        for flag, status, error_type, code, message in _ENVOY_FAILURES
    ]
    # Body over the buffer limit (Envoy's own 413) and ext_proc failures (500 from the filter).
    rows += [
        ({"status_code_filter": {"comparison": {
            "op": "EQ", "value": {"default_value": status, "runtime_key": f"extproc.local_reply.{status}"}}}},
         answer if answer != status else None, answer, error_type, code, message)
        for status, answer, error_type, code, message in _BY_STATUS
    ]
    mappers: list[dict[str, Any]] = []
    for condition, rewrite, status, error_type, code, message in rows:
        common: dict[str, Any] = {
            **({"status_code": rewrite} if rewrite else {}),
            **({"headers_to_add": [{"header": {"key": "retry-after", "value": "1"},
                                    "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}]} if status == 503 else {}),
        }
        # First match wins: the Messages path's variant comes first.
        mappers.append({"filter": _on_anthropic_path(condition), **common,
                        "body_format_override": anthropic_error_format(status, message)})
        mappers.append({"filter": condition, **common,
                        "body_format_override": openai_error_format(error_type, code, message)})
    return {"mappers": mappers}



def unrouted_response() -> dict[str, Any]:
    """Fail closed: the action of the route for requests our service did not route (it was unreachable,
    slow or died before its reply). ext_proc itself fails open (so that an exchange already routed survives
    the service), hence this route is what keeps every other request from reaching a model. The body is
    OpenAI-shaped on its own (an Istio listener has no local_reply_config of ours); with ours, the 500 mapper
    gives the Messages path Anthropic's shape."""
    body = ('{"error":{"message":"The gateway could not process the request","type":"server_error",'
            '"param":null,"code":"gateway_error"}}')
    return {
        "direct_response": {"status": 500, "body": {"inline_string": body}},
        "response_headers_to_add": [{"header": {"key": "content-type", "value": "application/json"},
                                     "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}],
    }
