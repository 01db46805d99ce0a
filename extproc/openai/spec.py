"""Parse OpenAI-style request bodies into a plain `InferenceRequest`; bounded, no I/O.

One generic parser plus a small table of per-API field rules, instead of one parser per endpoint.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, replace
from typing import Any

from extproc.openai.errors import ApiError, bad_request, too_large


class Api(enum.Enum):
    CHAT = "chat"
    COMPLETIONS = "completions"
    EMBEDDINGS = "embeddings"


PATHS: dict[str, Api] = {
    "/v1/chat/completions": Api.CHAT,
    "/v1/completions": Api.COMPLETIONS,
    "/v1/embeddings": Api.EMBEDDINGS,
}


@dataclass(frozen=True, slots=True)
class InferenceRequest:
    """What routing needs to know about one request; `document` is the parsed JSON body."""

    api: Api
    model: str
    stream: bool
    max_output_tokens: int | None
    prompt_text: str
    include_usage: bool
    user: str | None
    document: dict[str, Any]


def api_for_path(path: str) -> Api | None:
    return PATHS.get(path.partition("?")[0].rstrip("/") or "/")


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Iterative depth check over containers only (strings are leaves), stops at the first violation."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def decode_json(body: bytes, *, max_bytes: int, max_depth: int) -> dict[str, Any]:
    if len(body) > max_bytes:
        raise too_large(max_bytes)
    if not body:
        raise bad_request("Request body is empty; expected a JSON object", "invalid_json")
    try:
        document = json.loads(body)
    except RecursionError:
        raise bad_request(f"JSON nesting deeper than {max_depth}", "invalid_json") from None
    except UnicodeDecodeError:
        raise bad_request("Request body is not valid UTF-8", "invalid_json") from None
    except ValueError as exc:
        raise bad_request(f"Request body is not valid JSON: {exc}", "invalid_json") from None
    if not isinstance(document, dict):
        raise bad_request("Request body must be a JSON object", "invalid_json")
    if _depth_exceeds(document, max_depth):
        raise bad_request(f"JSON nesting deeper than {max_depth}", "invalid_json")
    return document


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [part.get("text", "") for part in content if isinstance(part, dict)]
        return "".join(p for p in parts if isinstance(p, str))
    return ""


def prompt_text(api: Api, document: dict[str, Any]) -> str:
    """The prompt as one text (chat: role-tagged messages): what prefix hashing and estimates read."""
    if api is Api.CHAT:
        messages = document.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad_request("'messages' must be a non-empty array", "invalid_value", "messages")
        pieces: list[str] = []
        for message in messages:
            if not isinstance(message, dict):
                raise bad_request("each message must be an object", "invalid_value", "messages")
            role = message.get("role")
            pieces.append(f"<|{role if isinstance(role, str) else ''}|>{_content_text(message.get('content'))}")
        return "\n".join(pieces)
    key = "prompt" if api is Api.COMPLETIONS else "input"
    prompt = document.get(key)
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return "\n".join(prompt)
    if isinstance(prompt, list):  # token ids: keep a stable text stand-in of the same length
        return " ".join(str(p) for p in prompt)
    raise bad_request(f"'{key}' is required", "invalid_value", key)


# The output limit fields, in the order vLLM reads them (max_completion_tokens wins).
_OUTPUT_FIELDS = ("max_completion_tokens", "max_tokens")


def _optional_int(document: dict[str, Any], *names: str) -> int | None:
    for name in names:
        value = document.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise bad_request(f"'{name}' must be a non-negative integer", "invalid_value", name)
        return value
    return None


def parse_request(api: Api, body: bytes, *, max_bytes: int, max_depth: int) -> InferenceRequest:
    """Validate the fields routing depends on; everything else passes through to vLLM untouched."""
    document = decode_json(body, max_bytes=max_bytes, max_depth=max_depth)
    model = document.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a string", "missing_model", "model")
    stream = document.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean", "invalid_value", "stream")
    if stream and api is Api.EMBEDDINGS:
        raise bad_request("embeddings do not support 'stream'", "invalid_value", "stream")
    options = document.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    user = document.get("user")
    return InferenceRequest(
        api=api,
        model=model,
        stream=stream,
        max_output_tokens=_optional_int(document, *_OUTPUT_FIELDS),
        prompt_text=prompt_text(api, document),
        include_usage=include_usage,
        user=user if isinstance(user, str) else None,
        document=document,
    )


def cap_output_tokens(request: InferenceRequest, cap: int) -> InferenceRequest | None:
    """The request with its output limited to `cap` tokens (fields over it lowered, `max_tokens` set when
    it named none; the document is changed in place), or None when it already asks for at most `cap`.
    Embeddings have no output to cap."""
    if request.api is Api.EMBEDDINGS or (request.max_output_tokens is not None and request.max_output_tokens <= cap):
        return None
    document = request.document
    present = [name for name in _OUTPUT_FIELDS if document.get(name) is not None]
    if not present:
        document["max_tokens"] = cap
    for name in present:
        value = document[name]
        if isinstance(value, int) and not isinstance(value, bool) and value > cap:
            document[name] = cap
    return replace(request, max_output_tokens=cap)


def rewrite_body(document: dict[str, Any], model: str | None, include_usage: bool = False) -> bytes:
    """Serialise the body with `model` replaced (alias -> served name) and/or usage requested in streams."""
    updated = dict(document)
    if model is not None:
        updated["model"] = model
    if include_usage:
        options = updated.get("stream_options")
        updated["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    return json.dumps(updated, separators=(",", ":"), ensure_ascii=False).encode()


__all__ = ["PATHS", "Api", "ApiError", "InferenceRequest", "api_for_path", "cap_output_tokens", "parse_request",
           "prompt_text", "rewrite_body"]
