"""OpenAI request parsing and response shapes as vLLM's OpenAI server produces them (sans-IO)."""

from __future__ import annotations

import base64
import hashlib
import json
import math
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from extproc.sim.profile import Profile
from extproc.sim.tokens import ChatTemplateError, Tokenizer, render_chat

__all__ = [
    "ApiError",
    "Limits",
    "chunk_bytes",
    "embedding_vector",
    "error_body",
    "output_plan",
    "parse_chat_prompt",
    "parse_completion_prompt",
    "parse_embedding_inputs",
    "parse_limits",
    "usage",
]

DONE = b"data: [DONE]\n\n"
_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 429: "RateLimitError",
                500: "InternalServerError", 503: "ServiceUnavailableError"}


class ApiError(Exception):
    """An OpenAI-shaped error response."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param)


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(status, "InternalServerError" if status >= 500 else "BadRequestError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def chunk_bytes(payload: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def _int_field(body: Mapping[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ApiError(400, f"{key} must be a non-negative integer", key)
    return value


def _bool_field(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if not isinstance(value, bool):
        raise ApiError(400, f"{key} must be a boolean", key)
    return value


def _token_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value)


def parse_chat_prompt(body: Mapping[str, Any], tokenizer: Tokenizer) -> tuple[str, list[int]]:
    tools = body.get("tools")
    try:
        text = render_chat(
            body.get("messages"),  # type: ignore[arg-type]  # validated inside
            tools=tools if isinstance(tools, list) else None,
            add_generation_prompt=body.get("add_generation_prompt", True) is not False,
            continue_final_message=body.get("continue_final_message") is True,
        )
    except ChatTemplateError as exc:
        raise ApiError(400, str(exc), "messages") from exc
    return text, tokenizer.encode(text)


def parse_completion_prompt(body: Mapping[str, Any], tokenizer: Tokenizer) -> tuple[str, list[int]]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        only = prompt[0]
        if isinstance(only, str) or _token_list(only):
            prompt = only
    if isinstance(prompt, str):
        if not prompt:
            raise ApiError(400, "The prompt cannot be empty.", "prompt")
        return prompt, tokenizer.encode(prompt)
    if isinstance(prompt, list) and _token_list(prompt):
        return tokenizer.decode(prompt), list(prompt)
    if isinstance(prompt, list) and prompt:
        raise ApiError(400, "the simulator serves one prompt per request", "prompt")
    raise ApiError(400, "prompt must be a string or a list of token ids", "prompt")


def parse_embedding_inputs(body: Mapping[str, Any], tokenizer: Tokenizer) -> list[list[int]]:
    value = body.get("input")
    if isinstance(value, str) or _token_list(value):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ApiError(400, "input must be a string, a list of strings or token id lists", "input")
    out: list[list[int]] = []
    for item in value:
        if isinstance(item, str) and item:
            out.append(tokenizer.encode(item))
        elif _token_list(item):
            out.append(list(item))
        else:
            raise ApiError(400, "input must be a string, a list of strings or token id lists", "input")
    return out


@dataclass(frozen=True, slots=True)
class Limits:
    """What a generation request asked for, already checked against the profile."""

    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool
    seed: int | None


def parse_limits(body: Mapping[str, Any], prompt_len: int, profile: Profile, *, chat: bool) -> Limits:
    if _int_field(body, "n") not in (None, 1):
        raise ApiError(400, "the simulator supports n=1 only", "n")
    requested = _int_field(body, "max_completion_tokens") if chat else None
    if requested is None:
        requested = _int_field(body, "max_tokens")
    room = profile.max_model_len - prompt_len
    if room <= 0 or (requested is not None and requested > room):
        asked = prompt_len + (requested or 0)
        raise ApiError(400, (
            f"This model's maximum context length is {profile.max_model_len} tokens. However, you requested "
            f"{asked} tokens ({prompt_len} in the messages, {requested or 0} in the completion). "
            "Please reduce the length of the messages or completion."), "max_tokens")
    if requested is None:
        requested = profile.default_max_tokens
    max_tokens = max(1, min(requested, profile.max_tokens_cap, room))
    min_tokens = min(_int_field(body, "min_tokens") or 0, max_tokens)
    stream = _bool_field(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", "stream_options")
    include_usage = bool(options and options.get("include_usage") is True)
    if include_usage and not stream:
        raise ApiError(400, "Stream options can only be defined when `stream=True`.", "stream_options")
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise ApiError(400, "seed must be an integer", "seed")
    return Limits(max_tokens=max_tokens, min_tokens=min_tokens, ignore_eos=_bool_field(body, "ignore_eos"),
                  stream=stream, include_usage=include_usage, seed=seed)


def _digest(token_ids: Sequence[int], *salts: int) -> int:
    h = hashlib.blake2b(array("I", token_ids).tobytes(), digest_size=8)
    for salt in salts:
        h.update(salt.to_bytes(8, "little", signed=True))
    return int.from_bytes(h.digest(), "little")


def output_plan(
    prompt_ids: Sequence[int], limits: Limits, profile: Profile, seed: int
) -> tuple[int, str, int]:
    """(output length, finish reason, text seed), all a pure function of the prompt and seeds."""
    digest = _digest(prompt_ids, seed, limits.seed or 0)
    if limits.ignore_eos:
        return limits.max_tokens, "length", digest
    fraction = profile.min_output_fraction + (1.0 - profile.min_output_fraction) * ((digest >> 11) / 2.0**53)
    length = max(1, limits.min_tokens, math.ceil(limits.max_tokens * fraction))
    if length >= limits.max_tokens:
        return limits.max_tokens, "length", digest
    return length, "stop", digest


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    # What vLLM reports with --enable-prompt-tokens-details: the prefix-cache hit of this request.
    out["prompt_tokens_details"] = None if cached_tokens is None else {"cached_tokens": cached_tokens}
    return out


def embedding_vector(token_ids: Sequence[int], dim: int, encoding: str) -> list[float] | str:
    """A unit vector that depends only on the token ids; base64 is little-endian float32 like OpenAI."""
    rng = np.random.default_rng(_digest(token_ids))
    vector = rng.standard_normal(dim).astype(np.float32)
    vector /= np.float32(np.linalg.norm(vector) or 1.0)
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return [float(x) for x in vector.tolist()]
