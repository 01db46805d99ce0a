"""Anthropic Messages and Responses bodies and SSE events in the shapes vLLM emits.

Anthropic (vLLM's message_stream_converter): `event: <type>\\ndata: <json>\\n\\n` events; `message_start` with
the prompt's tokens (`output_tokens` 0) at the first chunk, `content_block_start` (a text block), one
`content_block_delta` (`text_delta`) per chunk, then `content_block_stop`, `message_delta` with the stop reason
and the final usage (input and output tokens), and `message_stop`. Fields vLLM leaves unset are absent.
Responses (vLLM's simple streaming events): `response.created`, `response.in_progress`, the output item and
content part added, `response.output_text.delta` per chunk, their `.done` events, and `response.completed`
whose `response.usage` holds input/output tokens; every event has a `sequence_number`. No `[DONE]`.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

__all__ = ["MessagesStream", "ResponsesStream", "anthropic_message", "responses_body", "responses_usage"]

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _event(kind: str, payload: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


def anthropic_usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """`input_tokens` is the whole prompt (what the gateway settles); `cache_read_input_tokens` the part the
    prefix cache served (Anthropic's field; the routing bench's per-API hit rate reads it)."""
    return {"input_tokens": prompt_tokens, "output_tokens": completion_tokens,
            "cache_read_input_tokens": cached_tokens}


def anthropic_message(message_id: str, model: str, text: str, finish_reason: str, prompt_tokens: int,
                      completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    return {"id": message_id, "type": "message", "role": "assistant", "content": [{"type": "text", "text": text}],
            "model": model, "stop_reason": STOP_REASONS.get(finish_reason, "end_turn"),
            "usage": anthropic_usage(prompt_tokens, completion_tokens, cached_tokens)}


class MessagesStream:
    """Anthropic stream events of one response."""

    def __init__(self, message_id: str, model: str, prompt_tokens: int) -> None:
        self._id = message_id
        self._model = model
        self._prompt_tokens = prompt_tokens

    def text(self, text: str, first: bool) -> bytes:
        head = b""
        if first:
            head = _event("message_start", {"type": "message_start", "message": {
                "id": self._id, "content": [], "model": self._model, "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": self._prompt_tokens, "output_tokens": 0}}})
            head += _event("content_block_start", {"type": "content_block_start", "index": 0,
                                                   "content_block": {"type": "text", "text": ""}})
        return head + _event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                      "delta": {"type": "text_delta", "text": text}})

    def end(self, finish_reason: str, completion_tokens: int, cached_tokens: int = 0) -> bytes:
        return (_event("content_block_stop", {"type": "content_block_stop", "index": 0})
                + _event("message_delta", {"type": "message_delta",
                                           "delta": {"stop_reason": STOP_REASONS.get(finish_reason, "end_turn")},
                                           "usage": anthropic_usage(self._prompt_tokens, completion_tokens,
                                                                    cached_tokens)})
                + _event("message_stop", {"type": "message_stop"}))


def responses_body(response_id: str, body: dict[str, Any], model: str, text: str | None, finish_reason: str | None,
                   usage: dict[str, Any] | None, created: int) -> dict[str, Any]:
    """A ResponsesResponse: `text` None = still in progress (no output yet)."""
    status = "in_progress" if finish_reason is None else ("incomplete" if finish_reason == "length" else "completed")
    output = [] if text is None else [{
        "id": "msg_" + response_id.removeprefix("resp_"), "content": [
            {"annotations": [], "text": text, "type": "output_text", "logprobs": None}],
        "role": "assistant", "status": "completed", "type": "message"}]
    return {
        "id": response_id, "created_at": created,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.get("instructions"), "metadata": body.get("metadata"), "model": model,
        "object": "response", "output": output, "parallel_tool_calls": True, "temperature": 1.0,
        "tool_choice": "auto", "tools": [], "top_p": 1.0, "background": False,
        "max_output_tokens": body.get("max_output_tokens"), "max_tool_calls": None,
        "previous_response_id": body.get("previous_response_id"), "prompt": None, "reasoning": None,
        "service_tier": "auto", "status": status, "text": None, "top_logprobs": None, "truncation": "disabled",
        "usage": usage, "user": body.get("user"),
    }


def responses_usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None) -> dict[str, Any]:
    return {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": cached_tokens or 0},
            "output_tokens": completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + completion_tokens}


class ResponsesStream:
    """Responses stream events of one response; each gets the next sequence number."""

    def __init__(self, response_id: str, body: dict[str, Any], model: str) -> None:
        self._id = response_id
        self._body = body
        self._model = model
        self._created = int(time.time())
        self._sequence = 0
        self._item = "msg_" + uuid.uuid4().hex
        self._text: list[str] = []

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return _event(kind, payload)

    def start(self) -> bytes:
        snapshot = responses_body(self._id, self._body, self._model, None, None, None, self._created)
        return self._event("response.created", response=snapshot) + self._event("response.in_progress",
                                                                                response=snapshot)

    def text(self, text: str, first: bool) -> bytes:
        head = b""
        if first:
            head = self._event("response.output_item.added", output_index=0, item={
                "id": self._item, "content": [], "role": "assistant", "status": "in_progress", "type": "message"})
            head += self._event("response.content_part.added", output_index=0, item_id=self._item,
                                content_index=0, part={"annotations": [], "text": "", "type": "output_text",
                                                       "logprobs": []})
        self._text.append(text)
        return head + self._event("response.output_text.delta", content_index=0, output_index=0,
                                  item_id=self._item, delta=text, logprobs=[])

    def end(self, finish_reason: str, usage: dict[str, Any]) -> bytes:
        text = "".join(self._text)
        part: dict[str, Any] = {"annotations": [], "text": text, "type": "output_text", "logprobs": None}
        done = self._event("response.output_text.done", content_index=0, output_index=0, item_id=self._item,
                           text=text, logprobs=[])
        done += self._event("response.content_part.done", content_index=0, output_index=0, item_id=self._item,
                            part=part)
        done += self._event("response.output_item.done", output_index=0, item={
            "id": self._item, "content": [part], "role": "assistant", "status": "completed", "type": "message"})
        final = responses_body(self._id, self._body, self._model, text, finish_reason, usage, self._created)
        return done + self._event("response.completed", response=final)
