"""The text of a request that becomes prompt tokens, per API.

`prompt_text` is the conversation itself (what prefix hashing and the token estimate read). `prompt_slots`
is every string vLLM may render into the prompt, in document order: message contents (strings, text parts,
a single part given as an object), message `name`, `tool_calls` (function names and arguments),
`reasoning`, tool definitions (names, descriptions, parameter schemas: keys included, as the template
serialises them), RAG `documents`, a request's own `chat_template` and `chat_template_kwargs`,
`response_format` (newer chat templates render it), completion `prompt` and `suffix`, embedding `input`
and chat-style embedding `messages`; Anthropic Messages' `system`, `messages`, `tools` and `tool_choice`;
Responses' `instructions`, `input`, `tools`, `tool_choice`, `text` (its output format) and a stateless
`previous_response` (its output is rendered back into the prompt). Media (`image_url`, audio, video,
embeddings) is skipped: it is not text. What cannot be read as text at all (token-id prompts,
`prompt_embeds`) is reported by `unreadable_prompt` so a content guard can refuse it instead of passing it
on unscreened.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from extproc.openai.apis import Api
from extproc.openai.conversation import content_text, media_parts, turns
from extproc.openai.errors import bad_request

__all__ = ["MESSAGE_START", "PROMPT_FIELDS", "Slot", "extra_prompt_chars", "prompt_slots", "prompt_text",
           "prompt_view", "unreadable_prompt"]

_CONVERSATIONS = frozenset({Api.CHAT, Api.MESSAGES, Api.RESPONSES})

# Top-level fields whose strings vLLM renders into the prompt.
PROMPT_FIELDS: dict[Api, tuple[str, ...]] = {
    Api.CHAT: ("messages", "tools", "tool_choice", "documents", "chat_template", "chat_template_kwargs",
               "response_format"),
    Api.COMPLETIONS: ("prompt", "suffix"),
    Api.EMBEDDINGS: ("input", "messages", "chat_template", "chat_template_kwargs"),
    Api.MESSAGES: ("system", "messages", "tools", "tool_choice", "chat_template_kwargs"),
    Api.RESPONSES: ("instructions", "input", "tools", "tool_choice", "text", "previous_response"),
    Api.RERANK: ("query", "documents", "instruction"),
    Api.SCORE: ("text_1", "text_2", "queries", "documents", "items", "data_1", "data_2"),
    # The tokenizer alone: no model reads these, so there is nothing to screen or to hash for a prefix.
    Api.COUNT_TOKENS: (),
    Api.TOKENIZE: (),
    Api.DETOKENIZE: (),
}
_SCORING = frozenset({Api.RERANK, Api.SCORE})
# The fields `prompt_text` reads; the others count as extra prompt characters.
_TEXT_FIELDS = frozenset({"messages", "prompt", "input", "system", "instructions"})
# Content parts that are not text (their strings are URLs or base64 data).
MEDIA_KEYS = frozenset({"image_url", "input_image", "input_audio", "audio_url", "video_url", "image_embeds",
                        "image_pil", "file", "audio", "video", "image"})
_ANTHROPIC_MEDIA = MEDIA_KEYS | {"source"}

_TEXTUAL = frozenset({str, dict, list})
# Values that structure a message rather than say something (a role, a part's type, an id). They are
# screened too (a template renders a role name), but apart from the content, so that text split across
# messages or parts reads as one: "...ignore all previous" + "instructions".
_STRUCTURAL = frozenset({"role", "type", "id", "tool_call_id"})

# A string of the body: (container, key) for a value that may be replaced in place, or (None, text) for a
# dict key (read only: renaming a schema property would change the tool).
Slot = tuple[Any, Any]


# Where each message after the first begins in a conversation's `prompt_text` (`<|role|>content`, joined by
# newlines): prefix hashing remembers the chains of the text before it (extproc/scheduling/prefix.py).
MESSAGE_START = "\n<|"


def _joined(conversation: list[tuple[str, Any]]) -> str:
    return "\n".join(f"<|{role}|>{content_text(content)}" for role, content in conversation)


def prompt_view(api: Api, document: dict[str, Any]) -> tuple[str, tuple[int, int, int]]:
    """`prompt_text`, and the (image, audio, video) parts of a conversation, from one reading of it."""
    if api not in _CONVERSATIONS:
        return prompt_text(api, document), (0, 0, 0)
    if api is Api.CHAT:  # the common case, in one pass (the same reading as `turns`)
        messages = document.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad_request("'messages' must be a non-empty array", "invalid_value", "messages")
        conversation: list[tuple[str, Any]] = []
        pieces: list[str] = []
        for message in messages:
            if type(message) is not dict:
                raise bad_request("each message must be an object", "invalid_value", "messages")
            role, content = message.get("role"), message.get("content")
            role = role if type(role) is str else ""
            if type(content) is str:
                pieces.append(f"<|{role}|>{content}")
            else:  # parts (only those can hold media): walked once more for them
                conversation.append((role, content))
                pieces.append(f"<|{role}|>{content_text(content)}")
        return "\n".join(pieces), media_parts(conversation) if conversation else (0, 0, 0)
    conversation = turns(api, document)
    return _joined(conversation), media_parts(conversation)


def prompt_text(api: Api, document: dict[str, Any]) -> str:
    """The prompt as one text (chat: role-tagged messages): what prefix hashing and estimates read."""
    if api in _CONVERSATIONS:
        return _joined(turns(api, document))
    if api in _SCORING:  # every text of the query and the documents, in document order
        said, _ = prompt_slots(api, document)
        text = "\n".join(container[key] for container, key in said)
        if not text:
            raise bad_request(f"the {api.value} request names no text to score", "invalid_value",
                              PROMPT_FIELDS[api][0])
        return text
    if not PROMPT_FIELDS[api]:
        return ""
    key = "prompt" if api is Api.COMPLETIONS else "input"
    prompt = document.get(key)
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return "\n".join(prompt)
    if isinstance(prompt, list):  # token ids: keep a stable text stand-in of the same length
        return " ".join(map(str, prompt))
    if api is Api.EMBEDDINGS and isinstance(document.get("messages"), list):
        return prompt_text(Api.CHAT, document)
    raise bad_request(f"'{key}' is required", "invalid_value", key)


def _strings(value: Any, container: Any, key: Any) -> Iterator[Slot]:
    """Every string under `container[key]`, depth first in document order, dict keys included."""
    stack: list[tuple[Any, Any, Any]] = [(value, container, key)]
    while stack:
        item, parent, name = stack.pop()
        if isinstance(item, str):
            yield parent, name
        elif isinstance(item, dict):
            # An Anthropic image block keeps its bytes (or URL) under `source`.
            skip = _ANTHROPIC_MEDIA if item.get("type") == "image" else MEDIA_KEYS
            for k in item:
                if k not in skip:
                    yield None, k
            if _TEXTUAL.intersection(map(type, item.values())):
                stack.extend(reversed([(child, item, k) for k, child in item.items() if k not in skip]))
        elif isinstance(item, list) and _TEXTUAL.intersection(map(type, item)):  # skips number-only arrays in C
            stack.extend(reversed([(child, item, index) for index, child in enumerate(item)
                                   if type(child) in _TEXTUAL]))


def prompt_slots(api: Api, document: dict[str, Any]) -> tuple[list[Slot], list[Slot]]:
    """Every prompt-bearing string of the body (see the module docstring), in document order: (what the
    prompt says, what structures it: dict keys and role/type/id values)."""
    texts: list[Slot] = []
    meta: list[Slot] = []
    for field in PROMPT_FIELDS[api]:
        if field in document:
            for slot in _strings(document[field], document, field):
                (meta if slot[0] is None or slot[1] in _STRUCTURAL else texts).append(slot)
    return texts, meta


def _length(slots: Iterator[Slot]) -> int:
    return sum(len(key) if parent is None else len(parent[key]) for parent, key in slots)


def extra_prompt_chars(api: Api, document: dict[str, Any]) -> int:
    """Characters of prompt text outside `prompt_text` (message names, tool calls, tool definitions,
    documents, templates, suffix): the token estimate counts them too."""
    if api in _SCORING:  # prompt_text holds all of it
        return 0
    total = 0
    if api is Api.CHAT:
        for message in document.get("messages") or ():
            if isinstance(message, dict) and len(message) > 2:
                total += sum(_length(_strings(value, message, name)) for name, value in message.items()
                             if name not in ("role", "content"))
    for field in PROMPT_FIELDS[api]:
        if field not in _TEXT_FIELDS and field in document:
            total += _length(_strings(document[field], document, field))
    return total


def unreadable_prompt(api: Api, document: dict[str, Any]) -> str | None:
    """The field that carries prompt tokens no text screening can read (token ids, embeddings), if any."""
    if document.get("prompt_embeds") is not None:
        return "prompt_embeds"
    key = {Api.COMPLETIONS: "prompt", Api.EMBEDDINGS: "input"}.get(api)
    value = document.get(key) if key is not None else None
    if isinstance(value, list) and any(not isinstance(item, str) for item in value):
        return key
    return None
