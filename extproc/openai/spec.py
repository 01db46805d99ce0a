"""Parse OpenAI-style request bodies into a plain `InferenceRequest`; bounded, no I/O.

One generic parser plus a small table of per-API field rules, instead of one parser per endpoint. The
body is decoded once (C speed, bounded by its size); everything done in Python afterwards is bounded by
element counts checked before it runs: the number of chat messages (constant time), then one walk over
the JSON objects and arrays that stops at `max_containers` (containers holding only scalars, such as a
token-id prompt, cost one C-level pass).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

import orjson

from extproc.openai.apis import PATHS, SHAPES, Api, api_for_path
from extproc.openai.errors import ApiError, bad_request, too_complex, too_large
from extproc.openai.output import cap_document, output_bound
from extproc.openai.prompt import extra_prompt_chars, prompt_text, prompt_view

__all__ = ["PATHS", "Api", "ApiError", "BodyLimits", "InferenceRequest", "api_for_path", "cap_output_tokens",
           "decode_json", "parse_document", "parse_request", "prompt_text", "request_user", "requested_model",
           "rewrite_body"]


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """What one body may hold (policy `bounds`)."""

    max_bytes: int
    max_depth: int = 32
    max_containers: int = 20_000  # JSON objects + arrays
    max_messages: int = 2048
    max_choices: int = 128  # n / best_of


@dataclass(frozen=True, slots=True)
class InferenceRequest:
    """What routing needs to know about one request; `document` is the parsed JSON body."""

    api: Api
    model: str
    stream: bool
    max_output_tokens: int | None  # per generated sequence, as the engine reads the fields; None = up to the context
    prompt_text: str
    include_usage: bool
    user: str | None
    document: dict[str, Any]
    sequences: int = 1  # sequences the engine generates: n (or best_of) x prompts of a completions batch
    extra_prompt_chars: int = 0  # prompt text outside `prompt_text` (tools, documents, names, ...)
    images: int = 0  # image parts of the conversation (each costs the pool's `image_tokens`)
    audios: int = 0  # audio parts (each costs the pool's `audio_tokens`)
    videos: int = 0  # video parts (each costs the pool's `video_tokens`)
    previous_response_id: str | None = None  # Responses: the stored response this one continues

    @property
    def output_tokens(self) -> int | None:
        """Most tokens the engine may generate for the whole request (None = unbounded)."""
        return None if self.max_output_tokens is None else self.max_output_tokens * self.sequences


def decode_json(body: bytes, *, max_bytes: int) -> dict[str, Any]:
    """The body as a JSON object (size-checked first). orjson refuses what is not JSON text for a model: NaN and
    Infinity, numbers beyond a double, invalid UTF-8, a lone UTF-16 surrogate escape (\\uD800-\\uDFFF without
    its pair: no Unicode character, no tokenizer can encode it) and nesting past 1,024 levels (the policy's
    max_depth is checked after)."""
    if len(body) > max_bytes:
        raise too_large(max_bytes)
    if not body:
        raise bad_request("Request body is empty; expected a JSON object", "invalid_json")
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"Request body is not valid JSON: {exc}", "invalid_json") from None
    if not isinstance(document, dict):
        raise bad_request("Request body must be a JSON object", "invalid_json")
    return document


def request_user(api: Api, document: dict[str, Any]) -> str | None:
    """The end user a request names: body `user`, or on Anthropic's APIs `metadata.user_id` (Claude Code sends
    one per session); session affinity and user-sticky splits key on it."""
    user = document.get("user")
    if SHAPES[api].dialect == "anthropic":
        metadata = document.get("metadata")
        user = metadata.get("user_id") if isinstance(metadata, dict) else None
    return user if isinstance(user, str) else None


def requested_model(document: dict[str, Any]) -> str:
    model = document.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a string", "missing_model", "model")
    return model


_CONTAINER_SET = frozenset({dict, list})


def _check_structure(api: Api, document: dict[str, Any], limits: BodyLimits) -> None:
    """Depth and container count, stopping at the first violation."""
    field = SHAPES[api].conversation or "messages"
    messages = document.get(field)
    if isinstance(messages, list) and len(messages) > limits.max_messages:
        raise bad_request(f"'{field}' may hold at most {limits.max_messages} messages", "invalid_value", field)
    stack: list[tuple[Any, int]] = [(document, 1)]
    seen = 0
    while stack:
        item, depth = stack.pop()
        seen += 1
        if depth > limits.max_depth:
            raise bad_request(f"JSON nesting deeper than {limits.max_depth}", "invalid_json")
        values = item.values() if type(item) is dict else item
        if len(values) > 32 and not _CONTAINER_SET.intersection(map(type, values)):
            continue  # scalars only (e.g. token ids): one pass in C, no Python per element
        nested = [child for child in values if type(child) is dict or type(child) is list]
        if nested:
            if seen + len(stack) + len(nested) > limits.max_containers:
                raise too_complex(limits.max_containers)
            depth += 1
            stack.extend([(child, depth) for child in nested])


def parse_document(api: Api, document: dict[str, Any], limits: BodyLimits) -> InferenceRequest:
    """Validate the fields routing depends on; everything else passes through to vLLM untouched."""
    _check_structure(api, document, limits)
    shape = SHAPES[api]
    model = requested_model(document)
    stream = document.get("stream")
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean", "invalid_value", "stream")
    if stream and not shape.streams:
        raise bad_request(f"{api.value} do not support 'stream'", "invalid_value", "stream")
    options = document.get("stream_options")
    include_usage = shape.usage_in_stream or (isinstance(options, dict) and options.get("include_usage") is True)
    previous = document.get("previous_response_id") if api is Api.RESPONSES else None
    if previous is not None and not isinstance(previous, str):
        raise bad_request("'previous_response_id' must be a string", "invalid_value", "previous_response_id")
    if api is Api.RESPONSES and document.get("background") is True:
        # The generation would go on after the exchange ends: past its concurrency lease and its settlement.
        raise bad_request("background responses are not supported through this gateway", "invalid_value",
                          "background")
    per_sequence, sequences = output_bound(api, document, limits.max_choices)
    text, (images, audios, videos) = prompt_view(api, document)
    return InferenceRequest(
        api=api,
        model=model,
        stream=stream,
        max_output_tokens=per_sequence if shape.generates else None,
        prompt_text=text,
        include_usage=include_usage,
        user=request_user(api, document),
        document=document,
        sequences=sequences,
        extra_prompt_chars=extra_prompt_chars(api, document),
        images=images,
        audios=audios,
        videos=videos,
        previous_response_id=previous,
    )


def parse_request(api: Api, body: bytes, *, max_bytes: int, max_depth: int, **limits: int) -> InferenceRequest:
    """decode_json + parse_document in one call (`limits`: the other BodyLimits fields)."""
    return parse_document(api, decode_json(body, max_bytes=max_bytes),
                          BodyLimits(max_bytes, max_depth, **limits))


def cap_output_tokens(request: InferenceRequest, cap: int) -> InferenceRequest | None:
    """The request with every sequence limited to `cap` tokens, written into the fields the engine reads
    (the document is changed in place), or None when it already asks for at most `cap`. Embeddings have no
    output to cap (nor have scoring or the tokenizer)."""
    if not SHAPES[request.api].generates or not cap_document(request.api, request.document, request.max_output_tokens,
                                                         cap):
        return None
    return replace(request, max_output_tokens=cap)


def rewrite_body(document: dict[str, Any], model: str | None, include_usage: bool = False,
                 fields: dict[str, str] | None = None) -> bytes:
    """Serialise the body with `model` replaced (alias -> served name) and/or usage requested in streams, and
    top-level `fields` set.

    `decode_json` refuses lone surrogates; should one still be here (a document built elsewhere), the body is
    written with every non-ASCII character escaped instead of failing."""
    updated = dict(document)
    if model is not None:
        updated["model"] = model
    if fields:
        updated.update(fields)
    if include_usage:
        options = updated.get("stream_options")
        updated["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    try:
        return orjson.dumps(updated)
    except TypeError:  # a lone surrogate (orjson writes UTF-8 only)
        return json.dumps(updated, separators=(",", ":"), ensure_ascii=True).encode()
