"""Anthropic Messages and OpenAI Responses requests turned into a chat request, as vLLM serves them.

vLLM answers both by converting them into a chat completion (entrypoints/anthropic/serving.py, and the Responses
serving code) and converting the result back; the simulator does the same, so both APIs share the engine, the
chat template and the KV cache with /v1/chat/completions. Only what the simulator's template renders is kept.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from extproc.sim.protocol import ApiError

__all__ = ["BILLING_HEADER", "ResponseStore", "messages_to_chat", "responses_to_chat"]

BILLING_HEADER = "x-anthropic-billing-header"  # Claude Code's per-request system block; vLLM drops it


def _require_int(body: Mapping[str, Any], key: str, minimum: int, required: bool) -> int | None:
    value = body.get(key)
    if value is None:
        if required:
            raise ApiError(400, f"{key}: Field required", key)
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ApiError(400, f"{key} must be an integer >= {minimum}", key)
    return value


def _stream(body: Mapping[str, Any]) -> bool:
    value = body.get("stream")
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, "stream must be a boolean", "stream")
    return value is True


def _system_text(system: Any) -> str:
    if system is None:
        return ""
    if isinstance(system, str):
        return system
    if not isinstance(system, list):
        raise ApiError(400, "system must be a string or a list of text blocks", "system")
    texts = [block.get("text") for block in system if isinstance(block, dict) and block.get("type") == "text"]
    return "".join(t for t in texts if isinstance(t, str) and t and not t.startswith(BILLING_HEADER))


def _image_url(source: Any) -> str:
    if not isinstance(source, dict):
        return ""
    if source.get("type") == "url":
        return str(source.get("url", ""))
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def _anthropic_message(role: str, content: Any, out: list[dict[str, Any]]) -> None:
    if isinstance(content, str):
        out.append({"role": role, "content": content})
        return
    if not isinstance(content, list):
        raise ApiError(400, "content must be a string or a list of content blocks", "messages")
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for block in content:
        if not isinstance(block, dict):
            raise ApiError(400, "content blocks must be objects", "messages")
        kind = block.get("type")
        if kind == "text" and block.get("text"):
            parts.append({"type": "text", "text": str(block["text"])})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block.get("source"))}})
        elif kind == "tool_use":
            calls.append({"id": block.get("id") or "call", "type": "function", "function": {
                "name": block.get("name") or "", "arguments": json.dumps(block.get("input") or {})}})
        elif kind == "tool_result":
            result = block.get("content")
            text = result if isinstance(result, str) else "\n".join(
                str(item.get("text", "")) for item in result or () if isinstance(item, dict)
                and item.get("type") == "text")
            out.append({"role": "tool", "tool_call_id": block.get("tool_use_id") or "", "content": text})
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            parts.append({"type": "text", "text": block["thinking"]})
        elif kind not in ("text", "redacted_thinking", "tool_reference"):
            raise ApiError(400, f"unsupported content block type {kind!r}", "messages")
    if parts or calls:
        message: dict[str, Any] = {"role": role, "content": parts}
        if calls:
            message["tool_calls"] = calls
        out.append(message)


def messages_to_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat request vLLM makes of an Anthropic Messages request (raises ApiError 400 on a bad one)."""
    max_tokens = _require_int(body, "max_tokens", 1, required=True)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages: Field required (a non-empty list)", "messages")
    system = [_system_text(body.get("system"))]
    chat: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant", "system"):
            raise ApiError(400, "each message needs a role of user, assistant or system", "messages")
        if message["role"] == "system":
            system.append(_system_text(message.get("content")))
        else:
            _anthropic_message(message["role"], message.get("content"), chat)
    joined = "".join(system)
    tools = [{"type": "function", "function": {"name": t.get("name"), "description": t.get("description"),
                                               "parameters": t.get("input_schema")}}
             for t in body.get("tools") or () if isinstance(t, dict)]
    stream = _stream(body)
    return {"model": body.get("model"), "messages": ([{"role": "system", "content": joined}] if joined else []) + chat,
            "max_tokens": max_tokens, "stream": stream, "tools": tools or None,
            **({"stream_options": {"include_usage": True}} if stream else {})}


def _responses_input(items: Any, out: list[dict[str, Any]]) -> None:
    if isinstance(items, str):
        out.append({"role": "user", "content": items})
        return
    if not isinstance(items, list) or not items:
        raise ApiError(400, "input must be a string or a non-empty list of items", "input")
    for item in items:
        if not isinstance(item, dict):
            raise ApiError(400, "input items must be objects", "input")
        kind = item.get("type", "message")
        if kind == "message" and isinstance(item.get("role"), str):
            content = item.get("content")
            if isinstance(content, list):
                content = [{"type": "text", "text": str(p.get("text", ""))} if p.get("type") in (
                    "input_text", "output_text") else {"type": "image_url", "image_url": {"url": p.get("image_url")}}
                    for p in content if isinstance(p, dict)]
            out.append({"role": item["role"], "content": content})
        elif kind == "function_call":
            out.append({"role": "assistant", "content": None, "tool_calls": [{
                "id": item.get("call_id") or "call", "type": "function",
                "function": {"name": item.get("name") or "", "arguments": item.get("arguments") or ""}}]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item.get("call_id") or "", "content": str(item.get("output"))})
        elif kind != "reasoning":
            raise ApiError(400, f"unsupported input item type {kind!r}", "input")


def responses_to_chat(body: Mapping[str, Any], history: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat request of a Responses request; `history`: the stored conversation it continues."""
    if body.get("background") is True:
        raise ApiError(400, "the simulator does not run background responses", "background")
    max_tokens = _require_int(body, "max_output_tokens", 0, required=False)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ApiError(400, "instructions must be a string", "instructions")
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    messages += history
    _responses_input(body.get("input"), messages)
    tools = [{"type": "function", "function": {"name": t.get("name"), "parameters": t.get("parameters")}}
             for t in body.get("tools") or () if isinstance(t, dict)]
    return {"model": body.get("model"), "messages": messages, "max_tokens": max_tokens, "stream": _stream(body),
            "tools": tools or None, "seed": body.get("seed"), "ignore_eos": body.get("ignore_eos") is True}


class ResponseStore:
    """vLLM's in-process store of responses (`store: true`): a continuation finds its conversation only on
    the replica that served the response it names. Bounded: the oldest entries go first."""

    def __init__(self, capacity: int = 4096) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()

    def history(self, body: Mapping[str, Any]) -> list[dict[str, Any]]:
        previous = body.get("previous_response_id")
        if previous is None:
            return []
        found = self._entries.get(previous) if isinstance(previous, str) else None
        if found is None:
            raise ApiError(404, f"Response with id '{previous}' not found.", "previous_response_id")
        return list(found)

    def keep(self, response_id: str, conversation: list[dict[str, Any]], answer: str) -> None:
        self._entries[response_id] = [m for m in conversation if m.get("role") != "system"] + [
            {"role": "assistant", "content": answer}]
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)
