"""Response bodies and SSE chunks in the shapes vLLM's OpenAI server emits."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["StreamFormatter", "chat_response", "completion_response", "models_response"]


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def chat_response(request_id: str, created: int, model: str, text: str, finish_reason: str,
                  usage: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant", "content": text, "refusal": None, "annotations": None, "audio": None,
        "function_call": None, "tool_calls": [], "reasoning_content": None,
    }
    return {
        "id": request_id, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason,
                     "stop_reason": None}],
        "service_tier": None, "system_fingerprint": None, "usage": usage, "prompt_logprobs": None,
        "kv_transfer_params": None,
    }


def completion_response(request_id: str, created: int, model: str, text: str, finish_reason: str,
                        usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": request_id, "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
                     "stop_reason": None, "prompt_logprobs": None}],
        "service_tier": None, "system_fingerprint": None, "usage": usage, "kv_transfer_params": None,
    }


def models_response(
    model: str, adapters: tuple[str, ...], created: int, max_model_len: int
) -> dict[str, Any]:
    def card(name: str, root: str, parent: str | None, max_len: int | None) -> dict[str, Any]:
        permission = {"id": f"modelperm-{name}", "object": "model_permission", "created": created,
                      "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                      "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                      "organization": "*", "group": None, "is_blocking": False}
        return {"id": name, "object": "model", "created": created, "owned_by": "vllm", "root": root,
                "parent": parent, "max_model_len": max_len, "permission": [permission]}

    data = [card(model, model, None, max_model_len)]
    data.extend(card(a, f"/adapters/{a}", model, None) for a in adapters)
    return {"object": "list", "data": data}


class StreamFormatter:
    """SSE chunks of one streamed response; the constant JSON around the text is built once."""

    __slots__ = ("_chat", "_head", "_tail_done", "_tail_open")

    def __init__(self, request_id: str, created: int, model: str, *, chat: bool) -> None:
        self._chat = chat
        obj = "chat.completion.chunk" if chat else "text_completion"
        self._head = (f'data: {{"id":{_dumps(request_id)},"object":"{obj}","created":{created},'
                      f'"model":{_dumps(model)},"choices":')
        self._tail_open = ',"logprobs":null,"finish_reason":null}]}\n\n'
        self._tail_done = ',"logprobs":null,"finish_reason":"{}","stop_reason":null}}]}}\n\n'

    def role(self) -> bytes:
        """The first chat chunk: the assistant role with empty content."""
        delta = '[{"index":0,"delta":{"role":"assistant","content":""}'
        return (self._head + delta + self._tail_open).encode()

    def text(self, text: str, finish_reason: str | None = None) -> bytes:
        body = '{"content":' + _dumps(text) + "}" if self._chat else _dumps(text)
        field = '[{"index":0,"delta":' if self._chat else '[{"index":0,"text":'
        tail = self._tail_open if finish_reason is None else self._tail_done.format(finish_reason)
        return (self._head + field + body + tail).encode()

    def usage(self, usage: dict[str, Any]) -> bytes:
        return (self._head + '[],"usage":' + _dumps(usage) + "}\n\n").encode()
