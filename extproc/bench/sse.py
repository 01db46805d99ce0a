"""Scanning responses for the load generator, cheaply: SSE events checked for content with byte searches, JSON
decoded only for the object carrying `usage` (prompt, completion and prefix-cached tokens)."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["SseScanner", "usage_of"]

_CONTENT_KEYS = (b'"content"', b'"text"', b'"reasoning_content"', b'"arguments"', b'"delta"')  # delta: Responses


def _value_index(payload: bytes, key: bytes) -> int:
    """Index of the first byte of the JSON value following `key` (a quoted name), or -1."""
    n = len(payload)
    i = payload.find(key)
    while i >= 0:
        j = i + len(key)
        while j < n and payload[j] in b" \t":
            j += 1
        if j < n and payload[j] == 0x3A:  # ':'
            j += 1
            while j < n and payload[j] in b" \t":
                j += 1
            return j if j < n else -1
        i = payload.find(key, i + 1)
    return -1


def _carries_content(payload: bytes) -> bool:
    for key in _CONTENT_KEYS:
        j = _value_index(payload, key)
        if 0 <= j < len(payload) - 1 and payload[j] == 0x22 and payload[j + 1] != 0x22:
            return True
    return False


def _cached(usage: dict[str, Any]) -> Any:
    """Prompt tokens from the prefix cache (OpenAI's, Responses' `*_tokens_details`, else Anthropic's field)."""
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
    return details.get("cached_tokens") if isinstance(details, dict) else usage.get("cache_read_input_tokens")


def usage_of(payload: bytes) -> tuple[int | None, int | None, int | None] | None:
    """(prompt, completion, cached tokens) from a JSON object's non-null `usage` (or `response.usage`), else None."""
    j = _value_index(payload, b'"usage"')
    if j < 0 or payload[j] != 0x7B:  # '{'
        return None
    try:
        parsed = json.loads(payload)
        usage: Any = parsed.get("usage") or (parsed.get("response") or {}).get("usage")
        prompt = usage.get("prompt_tokens", usage.get("input_tokens"))  # OpenAI's, else Anthropic's/Responses'
        completion = usage.get("completion_tokens", usage.get("output_tokens"))
        cached = _cached(usage)
    except (ValueError, AttributeError):  # not JSON, or no usage object
        return None
    return tuple(v if isinstance(v, int) else None for v in (prompt, completion, cached))  # type: ignore[return-value]


class SseScanner:
    """Incremental, sans-IO scan of an OpenAI-style event stream (counts content events, finds usage)."""

    __slots__ = ("_buf", "cached_tokens", "chunks", "completion_tokens", "first_content_ns", "prompt_tokens")

    def __init__(self) -> None:
        self._buf = b""
        self.chunks = 0
        self.first_content_ns: int | None = None
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.cached_tokens: int | None = None

    def feed(self, data: bytes, now_ns: int) -> None:
        buf = self._buf + data if self._buf else data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        start = 0
        while (end := buf.find(b"\n\n", start)) >= 0:
            self._event(buf[start:end], now_ns)
            start = end + 2
        self._buf = buf[start:]

    def _event(self, event: bytes, now_ns: int) -> None:
        payload = b"\n".join(
            line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")
        )
        if not payload or payload == b"[DONE]":
            return
        if _carries_content(payload):
            self.chunks += 1
            if self.first_content_ns is None:
                self.first_content_ns = now_ns
        usage = usage_of(payload)
        if usage is not None:
            self.prompt_tokens, self.completion_tokens, self.cached_tokens = usage
