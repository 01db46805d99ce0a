"""A request's conversation as the engine renders it: (role, content) turns, per API, and the media it carries.

vLLM serves the Anthropic Messages and the Responses APIs by turning them into a chat conversation (its
`entrypoints/anthropic/serving.py` and `entrypoints/openai/responses/`): Anthropic's `system` (a string or text
blocks, minus Claude Code's per-request `x-anthropic-billing-header` block, which vLLM drops so that it does not
defeat prefix caching) becomes the first, system turn; `messages[].content` is a string or blocks (`text`,
`thinking`, `tool_use` with its JSON `input`, `tool_result` with its own content, `image`). Responses'
`instructions` is the system turn; `input` is a string (one user turn) or items: messages with parts
(`input_text`, `output_text`, `input_image`), `function_call` (name, arguments), `function_call_output`,
`reasoning`. What prefix hashing and the token estimate read is that text, in that order.
"""

from __future__ import annotations

from typing import Any

import orjson

from extproc.openai.apis import SHAPES, Api
from extproc.openai.errors import bad_request

__all__ = ["AUDIO_PARTS", "BILLING_HEADER", "IMAGE_PARTS", "VIDEO_PARTS", "content_text", "media_parts", "turns"]

BILLING_HEADER = "x-anthropic-billing-header"
IMAGE_PARTS = frozenset({"image_url", "image", "input_image", "image_pil", "image_embeds"})
AUDIO_PARTS = frozenset({"input_audio", "audio_url", "audio"})
VIDEO_PARTS = frozenset({"video_url", "video", "input_video", "video_embeds"})
_TEXT_KEYS = ("text", "refusal", "thinking")

Turn = tuple[str, Any]  # (role, content: a string, a part, or a list of parts)


def _part_text(part: Any) -> str:
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        return ""
    for key in _TEXT_KEYS:
        value = part.get(key)
        if isinstance(value, str):
            return value
    kind = part.get("type")
    if kind == "tool_use":  # Anthropic: rendered as a tool call with JSON arguments
        name = part.get("name")
        return (name if isinstance(name, str) else "") + orjson.dumps(part.get("input") or {}).decode()
    if kind == "function_call":  # Responses
        name, arguments = part.get("name"), part.get("arguments")
        return (name if isinstance(name, str) else "") + (arguments if isinstance(arguments, str) else "")
    if kind == "tool_result":
        return content_text(part.get("content"))
    if kind == "function_call_output":
        return content_text(part.get("output"))
    return ""


def content_text(content: Any) -> str:
    """The text of a message's content: a string, one part, or a list of parts (media parts add nothing)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_part_text(part) for part in content)
    return _part_text(content)


def _messages(document: dict[str, Any], field: str) -> list[Any]:
    messages = document.get(field)
    if not isinstance(messages, list) or not messages:
        raise bad_request(f"'{field}' must be a non-empty array", "invalid_value", field)
    return messages


def _anthropic_system(system: Any) -> str:
    if system is None:
        return ""
    if isinstance(system, str):
        return system
    if not isinstance(system, list):
        raise bad_request("'system' must be a string or an array of text blocks", "invalid_value", "system")
    pieces = [content_text(block) for block in system]
    return "".join(p for p in pieces if not p.startswith(BILLING_HEADER))


def _anthropic_turns(document: dict[str, Any]) -> list[Turn]:
    system = [_anthropic_system(document.get("system"))]
    rest: list[Turn] = []
    for message in _messages(document, "messages"):
        if not isinstance(message, dict):
            raise bad_request("each message must be an object", "invalid_value", "messages")
        role, content = message.get("role"), message.get("content")
        if not isinstance(content, str | list):
            raise bad_request("a message's 'content' must be a string or an array of content blocks",
                              "invalid_value", "messages")
        if role == "system":  # vLLM folds system messages into the system prompt
            system.append(_anthropic_system(content))
        else:
            rest.append((role if isinstance(role, str) else "", content))
    joined = "".join(system)
    return ([("system", joined)] if joined else []) + rest


def _responses_turns(document: dict[str, Any]) -> list[Turn]:
    instructions = document.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad_request("'instructions' must be a string", "invalid_value", "instructions")
    out: list[Turn] = [("system", instructions)] if instructions else []
    items = document.get("input")
    if isinstance(items, str):
        return [*out, ("user", items)]
    for item in _messages(document, "input"):
        if not isinstance(item, dict):
            raise bad_request("each input item must be an object", "invalid_value", "input")
        role = item.get("role")
        if isinstance(role, str):
            out.append((role, item.get("content")))
        else:  # function_call, function_call_output, reasoning, ...
            kind = item.get("type")
            out.append(("tool" if kind == "function_call_output" else "assistant",
                        item.get("content") if kind == "reasoning" else item))
    return out


def turns(api: Api, document: dict[str, Any]) -> list[Turn]:
    """The conversation of a chat-like request, in the order the engine's template renders it."""
    dialect = SHAPES[api].dialect
    if dialect == "anthropic":
        return _anthropic_turns(document)
    if dialect == "responses":
        return _responses_turns(document)
    out: list[Turn] = []
    for message in _messages(document, "messages"):
        if type(message) is not dict:
            raise bad_request("each message must be an object", "invalid_value", "messages")
        role = message.get("role")
        out.append((role if type(role) is str else "", message.get("content")))
    return out


def media_parts(conversation: list[Turn]) -> tuple[int, int, int]:
    """(image, audio, video parts) in the conversation's content, tool results included."""
    images = audios = videos = 0
    stack = [content for _, content in conversation if isinstance(content, list)]
    while stack:
        for part in stack.pop():
            if not isinstance(part, dict):
                continue
            kind = part.get("type")
            if kind in IMAGE_PARTS:
                images += 1
            elif kind in AUDIO_PARTS:
                audios += 1
            elif kind in VIDEO_PARTS:
                videos += 1
            elif kind == "tool_result" and isinstance(part.get("content"), list):
                stack.append(part["content"])
    return images, audios, videos
